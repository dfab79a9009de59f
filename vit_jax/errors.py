"""Errors whose message is all a user needs.

Every command-line tool goes through `vit_jax.cli`, which prints such an
error as `error: <message>` without a traceback and exits with status 2.
Only code that checks what a user gave raises them; anything else that goes
wrong is a bug and keeps its traceback (none of these is a ValueError, so
that no `except ValueError` can turn a bug into a user's mistake).

An InputError carries what it is about (its key) apart from what is wrong
with it (its message), and str() alone joins them: code that knows more of
where the error came from (the part of the config it was met in) adds that
as data (`ConfigError.of`), never by rebuilding a message from another's
text.
"""


class UserError(Exception):
  """A mistake the user can fix, which the message names."""


class InputError(UserError):
  """A value, file or path the user gave that cannot be used.

  `key`: the setting or flag it is about as the user names it (`augment`,
  `config.init_from`, `--topology`), where the message does not name it
  (a path stays in the message: `ConfigError.of` takes a key as a part of
  the one it was met in); `value`: what the user gave it, where shown
  beside the key. A user reads `KEY: MESSAGE`, or `KEY=VALUE: MESSAGE`
  (the value as repr() writes it), or the message alone where there is no
  key.
  """

  def __init__(self, message, key=None, value=None):
    super().__init__(message)
    self.message = message
    self.key = key
    self.value = value

  def __str__(self):
    if self.key is None:
      return self.message
    named = self.key if self.value is None else f"{self.key}={self.value!r}"
    return f"{named}: {self.message}"


class ConfigError(InputError):
  """A config value that cannot run, or that differs from its workdir's run."""

  @classmethod
  def of(cls, error, key=None, value=None, hint=None):
    """`error`, met in checking a config, as the ConfigError it is: an
    InputError, or an OSError of reading a file the config names.

    `key` (given `value`): the part of the config it was met in. An error
    with a key of its own is about a part of `key` (`config` and `augment`:
    `config.augment`); one without, about `key` itself. `hint`: what else
    the user can do, after the message.
    """
    if isinstance(error, InputError):
      message = error.message
      if error.key is not None:
        key = error.key if key is None else f"{key}.{error.key}"
        value = error.value
    else:
      message = os_error_message(error)
    if hint:
      message = f"{message} ({hint})"
    return cls(message, key, value)


class RunError(UserError):
  """The run cannot start or go on, for the reason the message gives."""


def os_error_message(error):
  """An OSError as a user reads it: 'PATH: No such file or directory',
  without errno's number."""
  if error.filename is None or not error.strerror:
    return str(error)
  return f"{error.filename}: {error.strerror}"
