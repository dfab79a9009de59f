"""Errors whose message is all a user needs; `vit_jax.main` prints it alone,
as the last lines of the output, without a traceback."""


class RunError(Exception):
  """The run cannot start or go on, for the reason the message gives."""


class ConfigError(RunError, ValueError):
  """A config that cannot run, or that differs from its workdir's run."""
