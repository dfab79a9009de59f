"""Errors whose message is all a user needs.

Every command-line tool goes through `vit_jax.cli`, which prints such an
error as `error: <message>` without a traceback and exits with status 2.
Only code that checks what a user gave raises them; anything else that goes
wrong is a bug and keeps its traceback (none of these is a ValueError, so
that no `except ValueError` can turn a bug into a user's mistake).
"""


class UserError(Exception):
  """A mistake the user can fix, which the message names."""


class InputError(UserError):
  """A value, file or path the user gave that cannot be used."""


class ConfigError(InputError):
  """A config value that cannot run, or that differs from its workdir's run."""


class RunError(UserError):
  """The run cannot start or go on, for the reason the message gives."""
