"""The one entry wrapper of every command-line tool (`python -m vit_jax.X`).

A tool module calls `cli.prepare()` first in its `__main__` block, before
JAX or TensorFlow is imported, and ends with `cli.run(main)`. Together they
give every tool the same behaviour:

- Quiet by default: no C++ logs of TensorFlow, XLA or libtpu, nothing that
  native code prints to stdout (Gloo's connection lines), no Python
  warnings, and of the Python log only vit_jax's own warnings and errors.
  `--verbose` brings all of the libraries' logs back, at INFO.
- Exit status: 0 done (a run stopped by a signal with its checkpoint saved
  included); EXIT_USER_ERROR (2) a user's mistake, shown as `error: ...` in
  at most MAX_ERROR_LINES lines on stderr without a traceback (with
  `--verbose`, after its traceback); 1 a bug, with Python's traceback.

A user's mistake is an `errors.UserError` (a bad config value, a file of the
wrong kind, a checkpoint that does not fit, ...), an OSError naming a path
(missing, not writable, disk full), a flag or config override that does not
parse, or an app.UsageError.
"""

import errno
import logging as std_logging
import os
import sys
import traceback
import warnings

from absl import app, flags, logging

from vit_jax import errors, runtime

EXIT_USER_ERROR = 2
MAX_ERROR_LINES = 3
VERBOSE_FLAG = "--verbose"

flags.DEFINE_bool("verbose", False, "Show the libraries' logs (TensorFlow, "
                  "XLA, TFDS, orbax, ...) and vit_jax's own at INFO.")

# OS errors that are the user's environment, not a bug, whatever the path.
_USER_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSPC,
                errno.EROFS, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR,
                errno.EEXIST, errno.ENAMETOOLONG}
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def verbose_requested(argv=None):
  """True if the command line asks for --verbose (before flags are parsed)."""
  argv = sys.argv if argv is None else argv
  return any(arg in (VERBOSE_FLAG, f"{VERBOSE_FLAG}=true", f"{VERBOSE_FLAG}=1")
             for arg in argv[1:])


def prepare():
  """The process's settings (vit_jax.runtime.prepare), --verbose read from
  the command line: call it before JAX or TensorFlow is imported."""
  runtime.prepare(verbose=verbose_requested())


def run(main, positional=False):
  """absl's app.run of `main`, with the log and the exit status above.
  `positional`: main takes arguments other than flags (image paths); else
  any is refused."""
  def checked(argv):
    if len(argv) > 1 and not positional:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return main(argv)
  app.run(lambda argv: _call(checked, argv), flags_parser=_parse_flags)


def _parse_flags(argv):
  try:
    rest = flags.FLAGS(argv)
    _check_config_files()
    return rest
  except Exception as e:  # pylint: disable=broad-except
    # A flag or a config override that does not parse, a config file that
    # is missing or fails: the user's command line in every case.
    if verbose_requested(argv):
      traceback.print_exc()
    _exit_with_message(_flag_error_message(e, argv))


def _check_config_files():
  """ml_collections defers a config file's load error to the first use of
  the config: raise it now, with the path."""
  for name, value in flags.FLAGS.flag_values_dict().items():
    if type(value).__name__ == "_ErrorConfig":
      path = flags.FLAGS[name].serialize().split("=", 1)[-1].split(":")[0]
      reason = ("no such file" if not os.path.exists(path)
                else "it does not load as a Python config file")
      raise errors.InputError(f"--{name}={path}: {reason}")


def _call(main, argv):
  verbose = flags.FLAGS.verbose
  _configure_logging(verbose)
  try:
    return main(argv)
  except Exception as e:  # pylint: disable=broad-except
    if not is_user_error(e):
      raise
    if verbose:
      traceback.print_exc()
    _exit_with_message(_os_error_message(e) if isinstance(e, OSError)
                       else str(e))


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


def _exit_with_message(message):
  sys.stdout.flush()
  print(error_message(message), file=sys.stderr, flush=True)
  sys.exit(EXIT_USER_ERROR)


def _os_error_message(e):
  """'PATH: No such file or directory', without errno's number."""
  if e.filename is None or not e.strerror:
    return str(e)
  return f"{e.filename}: {e.strerror}"


def _flag_error_message(e, argv):
  """One or two lines for a command line that does not parse."""
  if isinstance(e, errors.UserError):
    return str(e)
  if isinstance(e, OSError):
    return _os_error_message(e)
  message = str(e)
  causes = [e, e.__cause__, e.__context__]
  key_error = next((c for c in causes if isinstance(c, KeyError)), None)
  if key_error is not None:  # ml_collections: an override of no config key.
    key = str(key_error.args[0] if key_error.args else "").strip("'\"")
    given = [arg for arg in argv[1:] if arg.startswith("--config.")
             and key in arg.split("=")[0]]
    message = (f"{given[0] if given else key}: the config has no key {key!r}"
               " (its keys: configs/base.py)")
  elif "Error whilst parsing config file" in message:
    # ml_collections puts the config's whole traceback into the message:
    # its last line is what went wrong.
    flag = message.split(": Error whilst")[0]
    last = [line for line in message.splitlines() if line.strip()][-1]
    message = f"{flag}: {last.split(': ', 1)[-1]}"
  return f"{message}\n(--helpfull lists every flag)"


def _configure_logging(verbose):
  if verbose:
    logging.set_verbosity(logging.INFO)
    return
  _native_stdout_to_null()
  warnings.filterwarnings("ignore")
  logging.set_verbosity(logging.WARNING)
  logging.get_absl_handler().addFilter(_own_records)
  # TensorFlow's Python logger has a handler of its own.
  std_logging.getLogger("tensorflow").setLevel(std_logging.ERROR)
  sys.stderr = _WithoutClosedLoopTracebacks(sys.stderr)


class _WithoutClosedLoopTracebacks:
  """`stream` (sys.stderr) less the tracebacks that end in "RuntimeError:
  Event loop is closed". A checkpoint write that fails (a full disk) ends
  orbax's event loop while tensorstore's other writes are under way; each
  of their callbacks then prints one, dozens in all around the one error
  that matters. Python prints them straight to sys.stderr, past
  sys.excepthook."""

  def __init__(self, stream):
    self._stream = stream
    self._partial = ""  # Of a line not yet ended.
    self._traceback = []  # The lines of one being held back.

  def write(self, text):
    *lines, self._partial = (self._partial + text).split("\n")
    for line in lines:
      self._write_line(line + "\n")
    return len(text)

  def _write_line(self, line):
    if not self._traceback and not line.startswith("Traceback ("):
      self._stream.write(line)
      return
    self._traceback.append(line)
    if line.startswith((" ", "Traceback (")):
      return  # Its frames; the exception's own line ends it.
    held, self._traceback = "".join(self._traceback), []
    if line.strip() != "RuntimeError: Event loop is closed":
      self._stream.write(held)

  def flush(self):
    if self._partial and not self._traceback:
      self._stream.write(self._partial)
      self._partial = ""
    self._stream.flush()

  def __getattr__(self, name):  # fileno, isatty, encoding, ...
    return getattr(self._stream, name)


def _native_stdout_to_null():
  """Python's prints keep the terminal; what native code writes to file
  descriptor 1 goes nowhere. Gloo, the CPU collectives of a pod emulated by
  several processes, prints a line per device and peer there, from several
  threads at once, so that its lines come out interleaved."""
  sys.stdout.flush()
  terminal = os.dup(1)
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 1)
  os.close(null)
  sys.stdout = os.fdopen(terminal, "w", buffering=1)


def _own_records(record):
  """vit_jax's warnings and errors; nothing of the libraries."""
  return (record.levelno >= std_logging.WARNING
          and os.path.abspath(record.pathname).startswith(_PACKAGE_DIR))
