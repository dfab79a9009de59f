"""A tool's Python log: vit_jax's own warnings and errors as they come, the
libraries' errors held until the tool ends (`show_held`), the rest quiet;
`--verbose` shows every library's log at INFO as it comes."""

import logging as std_logging
import os
import sys
import traceback

from absl import logging

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def configure(verbose):
  """The log of a tool run with --verbose or without."""
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
  show_held."""
  if record.levelno < std_logging.WARNING:
    return False
  if os.path.abspath(record.pathname).startswith(_PACKAGE_DIR):
    return True
  if record.levelno >= std_logging.ERROR:
    _held_errors.append(record)
  return False


def show_held():
  """The libraries' errors held so far, shown now."""
  handler = logging.get_absl_handler()
  while _held_errors:
    handler.emit(_held_errors.pop(0))
