"""A tool's main run in the test's own process, as `cli.run` runs it in
its own (DESIGN.md: a tool runs in the test's own process), and the
process left as it was found."""

import contextlib
import logging as std_logging
import signal
import sys
import threading
import traceback

from absl import flags, logging

from vit_jax import cli
from vit_jax.cli import logs


def run_here(main, argv, positional=False):
  """What `cli.run(main, positional)` does with the command line `argv`
  (cli.call), done in this process and its exit status returned.

  The tool's output and log go to sys.stdout and sys.stderr as they are
  now; a bug's traceback is printed and gives 1, as the interpreter would.
  Every flag starts at its default, as in a new process. What `cli.run`
  changes is put back as it was: the flags' values (and the flags that
  parsing defines, a config's overrides, taken away), the log's handlers,
  levels and filters, the hooks, SIGINT's and SIGTERM's handlers,
  sys.argv, sys.path and the state of cli and its log. Not done here:
  `cli.prepare`'s settings, which are the process's.
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
    try:
      cli.call(main, argv, positional)
    except SystemExit as e:  # cli's end, always.
      status = _exit_status_of(e)
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()  # A bug: the interpreter's own report.
      status = 1
  return status


def _exit_status_of(stop):
  """The status a process ends with on the SystemExit `stop`."""
  if stop.code is None or isinstance(stop.code, int):
    return stop.code or 0
  print(stop.code, file=sys.stderr)
  return 1


@contextlib.contextmanager
def _as_found():
  """Puts back, after the block, the process's state that `cli.run`
  changes (run_here's list)."""
  # pylint: disable=protected-access
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
           list(sys.path), cli._exit_status, list(logs._held_errors))
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
     sys.path[:], cli._exit_status, logs._held_errors[:]) = state
    for name, level in levels.items():
      std_logging.getLogger(name).setLevel(level)
    if in_main_thread:
      for number, previous in handlers.items():
        if previous is not None:  # None: not set from Python.
          signal.signal(number, previous)
