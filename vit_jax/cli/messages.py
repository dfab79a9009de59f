"""What a tool prints for a user's mistake: which exceptions are one
(`is_user_error`), and their message, `error: ...` in at most
MAX_ERROR_LINES lines.

A user's mistake is an `errors.UserError` (a bad config value, a file of the
wrong kind, a checkpoint that does not fit, ...), an OSError naming a path
(missing, not writable, disk full), a flag or config override that does not
parse, or an app.UsageError.
"""

import errno
import re
import sys

from absl import app, flags

from vit_jax import errors
from vit_jax.cli import config_files

MAX_ERROR_LINES = 3

# OS errors that are the user's environment, not a bug, whatever the path.
_USER_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSPC,
                errno.EROFS, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR,
                errno.EEXIST, errno.ENAMETOOLONG}


def is_user_error(e):
  """True for exceptions that say what a user did wrong (module docstring)."""
  if isinstance(e, (errors.UserError, app.UsageError)):
    return True
  if isinstance(e, OSError):
    return e.errno in _USER_ERRNOS or e.filename is not None
  tf = sys.modules.get("tensorflow")
  # tf.io.gfile (GCS paths among them) raises these instead of OSError.
  return tf is not None and isinstance(
      e, (tf.errors.NotFoundError, tf.errors.PermissionDeniedError))


def error_message(message):
  """`message` as at most MAX_ERROR_LINES lines, the first `error: ...`."""
  lines = [line.strip() for line in str(message).strip().splitlines()
           if line.strip()] or ["failed without a message"]
  if len(lines) > MAX_ERROR_LINES:
    lines[MAX_ERROR_LINES - 1:] = ["; ".join(lines[MAX_ERROR_LINES - 1:])]
  lines[0] = f"error: {lines[0]}"
  return "\n".join(lines)


def of_mistake(e):
  """The message of `e`, a user's mistake (is_user_error) that a tool's
  main raised."""
  return errors.os_error_message(e) if isinstance(e, OSError) else str(e)


def of_command_line(e, argv):
  """The message of `e`, raised in parsing the command line `argv`: a flag
  or a config override that does not parse, a config file that is missing
  or fails."""
  return config_files.failure(argv) or _flag_error_message(e, argv)


def _flag_error_message(e, argv):
  """One or two lines for a command line that does not parse."""
  if isinstance(e, errors.UserError):
    return str(e)
  if isinstance(e, OSError):
    return errors.os_error_message(e)
  message = str(e)
  causes = [e, e.__cause__, e.__context__]
  key_error = next((c for c in causes if isinstance(c, KeyError)), None)
  if key_error is not None:  # ml_collections: an override of no config key.
    # Its message: the key quoted, then maybe a line with a suggestion.
    text = str(key_error.args[0] if key_error.args else "")
    key = text.splitlines()[0].strip("'\"") if text else ""
    suggested = re.search(r'Did you mean "([^"]+)"', text)
    given = [arg for arg in argv[1:] if arg.startswith("--config.")
             and key in arg.split("=")[0]]
    message = (f"{given[0] if given else key}: the config has no key {key!r}"
               + (f"; did you mean {suggested.group(1)!r}?" if suggested
                  else "") + " (its keys: vit_jax/runs/settings.py)")
  elif isinstance(e, flags.IllegalFlagValueError):
    # A flag that exists given a value it refuses (a bound, a validator):
    # absl's `flag --NAME=VALUE: what it takes` is the one line.
    return message
  return f"{message}\n(--helpfull lists every flag)"
