"""The one entry wrapper of every command-line tool (`python -m vit_jax.X`).

A tool module calls `cli.prepare()` first in its `__main__` block, before
JAX or TensorFlow is imported, and ends with `cli.run(main)`. Together they
give every tool the same behaviour:

- Quiet by default: no C++ logs of TensorFlow, XLA or libtpu (their own
  log levels, vit_jax/runtime.py), and of the Python log vit_jax's own
  warnings and errors as they come; the libraries' errors are held and
  shown as the tool ends, unless it ends with a user's mistake or a
  signal, whose one line says what happened (a full disk, for one, has
  orbax and asyncio log the write's failure from every thread).
  `--verbose` brings all of the libraries' logs back, at INFO, as they
  come. Python's warnings are left as Python shows them (a training run,
  a resume, export, figures, predict and plan give none).
  Native code's stdout is quieted only for gloo (runtime.join_pod).
- Exit status: 0 done (a run stopped by a signal with its checkpoint saved
  included); EXIT_USER_ERROR (2) a user's mistake, shown as `error: ...` in
  at most MAX_ERROR_LINES lines on stderr without a traceback (with
  `--verbose`, after its traceback); 1 a bug, with Python's traceback.
- A signal (SIGINT, SIGTERM) outside the training loop, which saves and
  exits 0 on its own (training/preemption.py), stops the tool with one line
  and 128 + its number: the work under way unwinds (a workdir's lock is
  released) and every file written is whole (vit_jax/paths.py).
- A quick end: once `main` has returned (or a signal stopped it), the exit
  handlers run (JAX's among them) and the last of them, registered first
  by `prepare`, ends the process without the interpreter's teardown, in
  which TensorFlow's native code would take time that no run's clock
  sees (docs/runs.md).

Tests run a tool's main in their own process through `run_here`: what
`run` does, its exit status returned instead of ending the process.

A user's mistake is an `errors.UserError` (a bad config value, a file of the
wrong kind, a checkpoint that does not fit, ...), an OSError naming a path
(missing, not writable, disk full), a flag or config override that does not
parse, or an app.UsageError.
"""

import atexit
import contextlib
import errno
import logging as std_logging
import os
import re
import signal
import sys
import threading
import traceback

from absl import app, flags, logging
from ml_collections.config_flags import config_flags as ml_config_flags

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
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checkout that holds the package, with the shipped configs/ beside it.
_CHECKOUT_DIR = os.path.dirname(_PACKAGE_DIR)


def verbose_requested(argv=None):
  """True if the command line asks for --verbose (before flags are parsed)."""
  argv = sys.argv if argv is None else argv
  return any(arg in (VERBOSE_FLAG, f"{VERBOSE_FLAG}=true", f"{VERBOSE_FLAG}=1")
             for arg in argv[1:])


def prepare():
  """The process's settings (vit_jax.runtime.prepare), --verbose read from
  the command line, and signals that stop it quietly: call it before JAX
  or TensorFlow is imported."""
  _stop_quietly_on_signals()
  # Registered before any library's, so it runs after all of theirs.
  atexit.register(_skip_teardown)
  runtime.prepare(verbose=verbose_requested())


class Stopped(KeyboardInterrupt):
  """A signal asked the tool to stop (outside the training loop, which
  handles its own)."""

  def __init__(self, signum):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def _raise_stopped(signum, frame):
  del frame
  raise Stopped(signum)


def _stop_quietly_on_signals():
  """SIGINT and SIGTERM raise Stopped, which `run` (or, before it, the
  interpreter's last handler) turns into one line; a signal the process
  was started ignoring stays ignored."""
  for number in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(number) is not signal.SIG_IGN:
      signal.signal(number, _raise_stopped)
  sys.unraisablehook = _stopped_again(sys.unraisablehook)
  previous = sys.excepthook

  def last_handler(kind, value, trace):
    if isinstance(value, KeyboardInterrupt):
      _exit_stopped(value)
    previous(kind, value, trace)
  sys.excepthook = last_handler


def _stopped_again(hook):
  """`hook` (sys.unraisablehook), but a Stopped that Python could not raise
  is raised again.

  A signal's handler runs wherever the main thread is. There, inside a
  garbage collector's callback (JAX registers one) or a finalizer, Python
  prints the exception and drops it: the tool went on and exited 0. The
  signal is sent again, a moment later from a timer's thread (sent from
  here, its handler would run at once, still inside the callback), for the
  handler to run once the callback has returned; if it lands in one again,
  this happens again.
  """
  def again(unraisable):
    if isinstance(unraisable.exc_value, Stopped):
      resend = threading.Timer(0.01, os.kill, (
          os.getpid(), unraisable.exc_value.signum))
      resend.daemon = True
      resend.start()
    else:
      hook(unraisable)
  return again


def _signal_number(stopped):
  return getattr(stopped, "signum", signal.SIGINT)


def _report_stopped(stopped):
  sys.stdout.flush()
  print(f"error: stopped by {signal.Signals(_signal_number(stopped)).name}; "
        "files written so far are whole: run the same command again",
        file=sys.stderr, flush=True)


def _exit_stopped(stopped):
  """One line, and 128 + the signal's number, at once: for a signal that
  came before `run` (nothing to unwind)."""
  _report_stopped(stopped)
  os._exit(128 + _signal_number(stopped))


def run(main, positional=False):
  """absl's app.run of `main`, with the log and the exit status above.
  `positional`: main takes arguments other than flags (image paths); else
  any is refused."""
  _shipped_configs_importable()
  app.run(lambda argv: _end(_call(_checked(main, positional), argv)),
          flags_parser=_parse_flags)


def run_here(main, argv, positional=False):
  """What `run(main, positional)` does with the command line `argv`, done
  in this process and its exit status returned, for tests (DESIGN.md: a
  tool runs in the test's own process).

  The tool's output and log go to sys.stdout and sys.stderr as they are
  now; a bug's traceback is printed and gives 1, as the interpreter would.
  Every flag starts at its default, as in a new process. What `run`
  changes is put back as it was: the flags' values (and the flags that
  parsing defines, a config's overrides, taken away), the log's handlers,
  levels and filters, the hooks, SIGINT's and SIGTERM's handlers,
  sys.argv, sys.path and this module's state. Not done here: `prepare`'s
  settings, which are the process's, and app.run's own flags (--helpfull,
  --run_with_pdb, ...).
  """
  with _as_found():
    sys.argv = list(argv)  # ml_collections reads a config's overrides there.
    flags.FLAGS.unparse_flags()
    # Where app.run has absl log: its handler on the root logger, which
    # writes to stderr.
    handler = logging.get_absl_handler()
    handler.python_handler.stream = sys.stderr
    if handler not in std_logging.root.handlers:
      std_logging.root.addHandler(handler)
    _shipped_configs_importable()
    try:
      _end(_call(_checked(main, positional), _parse_flags(argv)))
    except SystemExit as e:  # _end's, always.
      status = _exit_status_of(e)
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()  # A bug: the interpreter's own report.
      status = 1
  return status


def _checked(main, positional):
  """`main`, refusing arguments other than flags unless `positional`."""
  def checked(argv):
    if len(argv) > 1 and not positional:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return main(argv)
  return checked


def _exit_status_of(stop):
  """The status a process ends with on the SystemExit `stop`."""
  if stop.code is None or isinstance(stop.code, int):
    return stop.code or 0
  print(stop.code, file=sys.stderr)
  return 1


@contextlib.contextmanager
def _as_found():
  """Puts back, after the block, the process's state that `run` changes
  (run_here's list)."""
  global _exit_status
  parsed = flags.FLAGS.is_parsed()
  names = set(flags.FLAGS)
  # Each flag once (a short name is a second key to the same flag).
  flag_states = {id(flag): (flag, dict(vars(flag))) for flag in
                 (flags.FLAGS[name] for name in flags.FLAGS)}
  handler = logging.get_absl_handler()
  levels = {name: std_logging.getLogger(name).level
            for name in ("", "absl", "tensorflow")}
  state = (list(std_logging.root.handlers), list(handler.filters),
           handler.python_handler.stream, sys.unraisablehook, sys.argv,
           list(sys.path), _exit_status, list(_held_errors))
  in_main_thread = threading.current_thread() is threading.main_thread()
  handlers = {number: signal.getsignal(number)
              for number in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    for name in set(flags.FLAGS) - names:
      delattr(flags.FLAGS, name)
    # Unparsing sets --verbosity, whose setter moves log levels: first.
    if parsed:
      flags.FLAGS.mark_as_parsed()
    else:
      flags.FLAGS.unparse_flags()
    for flag, values in flag_states.values():
      vars(flag).clear()
      vars(flag).update(values)
    (std_logging.root.handlers[:], handler.filters[:],
     handler.python_handler.stream, sys.unraisablehook, sys.argv,
     sys.path[:], _exit_status, _held_errors[:]) = state
    for name, level in levels.items():
      std_logging.getLogger(name).setLevel(level)
    if in_main_thread:
      for number, previous in handlers.items():
        if previous is not None:  # None: not set from Python.
          signal.signal(number, previous)


def _shipped_configs_importable():
  """Lets a config file loaded from any folder import the shipped configs
  as `configs` (its siblings, or `base` under a user's own file), as it
  does in the checkout; last on the path, so a folder's own `configs`
  wins."""
  if (os.path.exists(os.path.join(_CHECKOUT_DIR, "configs", "base.py"))
      and _CHECKOUT_DIR not in sys.path):
    sys.path.append(_CHECKOUT_DIR)


# The exit status that _skip_teardown ends the process with; None until
# the tool has finished (a bug's traceback ends it the interpreter's way).
_exit_status = None


def _end(code, show_held=True):
  """Exits with `main`'s exit `code` (None: 0) now that it has returned;
  the libraries' errors held so far shown first, if `show_held`."""
  global _exit_status
  if show_held:
    _show_held_errors()
  _exit_status = code or 0
  sys.exit(_exit_status)


def _skip_teardown():
  """The last exit handler: output flushed, the process ends with the
  tool's status before the interpreter's teardown."""
  if _exit_status is None:
    return
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(_exit_status)


def _parse_flags(argv):
  try:
    rest = flags.FLAGS(argv)
    for name in _config_file_flags():
      flag = flags.FLAGS[name]
      error = _load_error(flag.value)
      if error is not None:
        raise errors.InputError(_config_file_message(
            name, ml_config_flags.get_config_filename(flag), error))
    return rest
  except Exception as e:  # pylint: disable=broad-except
    # A flag or a config override that does not parse, a config file that
    # is missing or fails: the user's command line in every case.
    if verbose_requested(argv):
      traceback.print_exc()
    _exit_with_message(_config_file_failure(argv) or
                       _flag_error_message(e, argv))


def _config_file_flags():
  """The names of the flags that take an ml_collections config file."""
  return [name for name in flags.FLAGS if isinstance(
      flags.FLAGS[name].parser, ml_config_flags.ConfigFileFlagParser)]


def _load_error(config):
  """The error of a config file that did not load, or None.

  For a file that is missing or raises an OSError, ml_collections' parser
  returns, in place of the config, a stand-in whose every attribute access
  raises an OSError caused by the load's error; a config that loaded lets
  this lookup of a name it lacks fall back to the default.
  """
  try:
    getattr(config, "_vit_jax_no_such_field", None)
  except OSError as e:
    return e.__cause__ or e
  return None


def _config_file_failure(argv):
  """Why a config file named on the command line does not load, or None.

  Parsing stops at the first error, which may come from the failed config
  (an override of a config that did not load) or hide it: each file is
  loaded again here, so that its own error is the one reported.
  """
  for name in _config_file_flags():
    for argument in _flag_arguments(argv, name):
      try:
        error = _load_error(flags.FLAGS[name].parser.parse(argument))
      except (TypeError, ValueError) as e:
        # ml_collections re-raises these with the config's traceback as
        # the message (for absl, which keeps only the message); the
        # config's own error is what it re-raised.
        error = e.__context__ or e
      except Exception as e:  # pylint: disable=broad-except
        error = e  # The config's own, as raised (a SyntaxError, ...).
      if error is not None:
        return _config_file_message(name, argument, error)
  return None


def _flag_arguments(argv, name):
  """The values given to flag `name` in argv (`--name=V` or `--name V`)."""
  values = []
  for i, arg in enumerate(argv[1:], 1):
    flag, equals, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and flag == name:
      if equals:
        values.append(value)
      elif i + 1 < len(argv):
        values.append(argv[i + 1])
  return values


def _config_file_message(name, argument, error):
  """`--NAME=ARGUMENT: why` for a config file that does not load."""
  path = argument.split(":", 1)[0]
  if not os.path.exists(path):
    return f"--{name}={path}: no such file"
  if isinstance(error, OSError) and error.strerror:
    # The file's own (a directory) or one of a file that the config reads,
    # which is then named.
    reason = (error.strerror if error.filename in (None, path)
              else _os_error_message(error))
  else:
    reason = str(error) or type(error).__name__
  return f"--{name}={argument}: {reason}"


def _call(main, argv):
  verbose = flags.FLAGS.verbose
  _configure_logging(verbose)
  try:
    return main(argv)
  except KeyboardInterrupt as e:  # Stopped too: the work has unwound.
    _report_stopped(e)
    _end(128 + _signal_number(e), show_held=False)
  except Exception as e:  # pylint: disable=broad-except
    if not is_user_error(e):
      _show_held_errors()
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


def _configure_logging(verbose):
  if verbose:
    logging.set_verbosity(logging.INFO)
    return
  logging.set_verbosity(logging.WARNING)
  # absl sends every library's records (orbax, clu, ...) and vit_jax's
  # through one logger, "absl", so no logger's level tells them apart: only
  # the file that logged does.
  logging.get_absl_handler().addFilter(_shown)
  # TensorFlow's Python logger has a handler of its own.
  std_logging.getLogger("tensorflow").setLevel(std_logging.ERROR)
  sys.unraisablehook = _without_closed_loop_errors(sys.unraisablehook)


def _without_closed_loop_errors(hook):
  """`hook` (sys.unraisablehook) less the errors of callbacks that hand a
  result to an event loop that is closed.

  A checkpoint write that fails (a full disk) ends orbax's event loop while
  tensorstore's other writes are under way. As each completes, tensorstore
  calls the loop's call_soon_threadsafe from its own thread; the closed loop
  raises RuntimeError there, which tensorstore hands to
  PyErr_WriteUnraisable: dozens of tracebacks around the one error that
  matters, each telling only that the loop is gone.
  """
  def quieter(unraisable):
    if not _from_a_closed_loop(unraisable):
      hook(unraisable)
  return quieter


def _from_a_closed_loop(unraisable):
  """True for a RuntimeError raised by an event loop's (asyncio's, uvloop's)
  closed check within its call_soon_threadsafe."""
  if (unraisable.exc_type is not RuntimeError
      or unraisable.exc_traceback is None):
    return False
  names = [frame.name.rsplit(".", 1)[-1]  # uvloop's: "uvloop.loop.Loop.x"
           for frame in traceback.extract_tb(unraisable.exc_traceback)]
  return names[-1] == "_check_closed" and "call_soon_threadsafe" in names


# The libraries' ERROR records not shown yet (_shown).
_held_errors = []


def _shown(record):
  """vit_jax's own warnings and errors. The libraries' warnings that come
  through absl's logger are notes on their internals (orbax's on the
  checkpoint layout, clu's on its writers); their errors are held for
  _show_held_errors."""
  if record.levelno < std_logging.WARNING:
    return False
  if os.path.abspath(record.pathname).startswith(_PACKAGE_DIR):
    return True
  if record.levelno >= std_logging.ERROR:
    _held_errors.append(record)
  return False


def _show_held_errors():
  handler = logging.get_absl_handler()
  while _held_errors:
    handler.emit(_held_errors.pop(0))
