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
  come (cli/logs.py). Python's warnings are left as Python shows them (a
  training run, a resume, export, figures, predict and plan give none).
  Native code's stdout is quieted only for gloo (runtime.join_pod).
- Exit status: 0 done (a run stopped by a signal with its checkpoint saved
  included); EXIT_USER_ERROR (2) a user's mistake (cli/messages.py), shown
  as `error: ...` in at most messages.MAX_ERROR_LINES lines on stderr
  without a traceback (with `--verbose`, after its traceback); 1 a bug,
  with Python's traceback.
- A signal (SIGINT, SIGTERM) outside the training loop stops the tool with
  one line and 128 + its number (cli/signals.py).
- A quick end: once `main` has returned (or a signal stopped it), the exit
  handlers run (JAX's among them) and the last of them, registered first
  by `prepare`, ends the process without the interpreter's teardown, in
  which TensorFlow's native code would take time that no run's clock
  sees (docs/runs.md).

Tests run a tool's main in their own process through `call`
(tests/in_process.py).
"""

import atexit
import functools
import os
import sys
import traceback

from absl import app, flags, logging

from vit_jax import runtime
from vit_jax.cli import config_files, logs, messages, signals

EXIT_USER_ERROR = 2
VERBOSE_FLAG = "--verbose"

flags.DEFINE_bool("verbose", False, "Show the libraries' logs (TensorFlow, "
                  "XLA, TFDS, orbax, ...) and vit_jax's own at INFO.")

# The checkout that holds the package, with the shipped configs/ beside it.
_CHECKOUT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def verbose_requested(argv=None):
  """True if the command line asks for --verbose (before flags are parsed)."""
  argv = sys.argv if argv is None else argv
  return any(arg in (VERBOSE_FLAG, f"{VERBOSE_FLAG}=true", f"{VERBOSE_FLAG}=1")
             for arg in argv[1:])


def prepare():
  """The process's settings (vit_jax.runtime.prepare), --verbose read from
  the command line, and signals that stop it quietly: call it before JAX
  or TensorFlow is imported."""
  signals.stop_quietly()
  # Registered before any library's, so it runs after all of theirs.
  atexit.register(_skip_teardown)
  runtime.prepare(verbose=verbose_requested())


def run(main, positional=False):
  """absl's app.run of `main`, with the log and the exit status above.
  `positional`: main takes arguments other than flags (image paths); else
  any is refused."""
  _shipped_configs_importable()
  app.run(functools.partial(_main_then_end, main, positional),
          flags_parser=_parse_flags)


def call(main, argv, positional=False):
  """What `run(main, positional)` does with the command line `argv` but
  app.run's own part (its flags: --helpfull, --run_with_pdb, ...): the
  flags parsed, main called, and SystemExit raised with the exit status,
  in this process; for tests (DESIGN.md: a tool runs in the test's own
  process). A bug's exception is raised."""
  _shipped_configs_importable()
  _main_then_end(main, positional, _parse_flags(argv))


def _main_then_end(main, positional, argv):
  _end(_call(_checked(main, positional), argv))


def _checked(main, positional):
  """`main`, refusing arguments other than flags unless `positional`."""
  def checked(argv):
    if len(argv) > 1 and not positional:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    return main(argv)
  return checked


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
    logs.show_held()
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
    config_files.check_loaded()
    return rest
  except Exception as e:  # pylint: disable=broad-except
    # A flag or a config override that does not parse, a config file that
    # is missing or fails: the user's command line in every case.
    if verbose_requested(argv):
      traceback.print_exc()
    _exit_with_message(messages.of_command_line(e, argv))


def _call(main, argv):
  verbose = flags.FLAGS.verbose
  logs.configure(verbose)
  try:
    return main(argv)
  except KeyboardInterrupt as e:  # Stopped too: the work has unwound.
    signals.report(e)
    _end(signals.exit_status(e), show_held=False)
  except Exception as e:  # pylint: disable=broad-except
    if not messages.is_user_error(e):
      logs.show_held()
      raise
    if verbose:
      traceback.print_exc()
    _exit_with_message(messages.of_mistake(e))


def _exit_with_message(message):
  sys.stdout.flush()
  print(messages.error_message(message), file=sys.stderr, flush=True)
  sys.exit(EXIT_USER_ERROR)
