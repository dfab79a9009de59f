"""Errors whose message is all a user needs; `vit_jax.main` prints it alone,
as the last lines of the output, without a traceback."""

import functools
import sys


class RunError(Exception):
  """The run cannot start or go on, for the reason the message gives."""


class ConfigError(RunError, ValueError):
  """A config that cannot run, or that differs from its workdir's run."""


def reported(main):
  """`main` for a command-line tool that reads files a user names: a
  ValueError or OSError ends it with its message and exit status 1, not a
  traceback."""
  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except (ValueError, OSError) as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)
  return wrapped
