"""SIGINT and SIGTERM outside the training loop (which saves and exits 0 on
its own, training/preemption.py): the tool stops with one line and 128 +
the signal's number, the work under way unwound (a workdir's lock is
released) and every file written whole (vit_jax/paths.py)."""

import os
import signal
import sys
import threading


class Stopped(KeyboardInterrupt):
  """A signal asked the tool to stop (outside the training loop, which
  handles its own)."""

  def __init__(self, signum):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def raise_stopped(signum, frame):
  """The handler of SIGINT and SIGTERM in a tool's process."""
  del frame
  raise Stopped(signum)


def stop_quietly():
  """SIGINT and SIGTERM raise Stopped, which `cli.run` (or, before it, the
  interpreter's last handler) turns into one line; a signal the process
  was started ignoring stays ignored."""
  for number in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(number) is not signal.SIG_IGN:
      signal.signal(number, raise_stopped)
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


def exit_status(stopped):
  """The status a tool stopped by `stopped` (a Stopped, or a
  KeyboardInterrupt: ^C) ends with: 128 + the signal's number."""
  return 128 + _signal_number(stopped)


def report(stopped):
  """The one line that a stopped tool prints."""
  sys.stdout.flush()
  print(f"error: stopped by {signal.Signals(_signal_number(stopped)).name}; "
        "files written so far are whole: run the same command again",
        file=sys.stderr, flush=True)


def _signal_number(stopped):
  return getattr(stopped, "signum", signal.SIGINT)


def _exit_stopped(stopped):
  """One line, and the exit status, at once: for a signal that came before
  `cli.run` (nothing to unwind)."""
  report(stopped)
  os._exit(exit_status(stopped))
