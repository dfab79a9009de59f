"""Errors whose message is all a user needs.

Every command-line tool goes through `vit_jax.cli`, which prints such an
error as `error: <message>` without a traceback and exits with status 2.
Library code raises them for mistakes a user can fix; anything else that
goes wrong is a bug and keeps its traceback.
"""


class UserError(Exception):
  """A mistake the user can fix, which the message names."""


class InputError(UserError, ValueError):
  """A value, file or path the user gave that cannot be used."""


class RunError(UserError):
  """The run cannot start or go on, for the reason the message gives."""


class ConfigError(RunError, ValueError):
  """A config that cannot run, or that differs from its workdir's run."""
