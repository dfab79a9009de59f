"""Stopping cleanly at a step boundary on SIGTERM or SIGINT.

A Cloud TPU VM gets SIGTERM before maintenance or preemption. The train loop
asks `stop_requested(step)` after every step; when it says yes, the loop
saves a checkpoint at that step, writes its metrics and returns, and the
process exits 0. Rerunning the same command resumes from that step.

On several processes every one of them must stop at the same step, and the
signal may reach only some. JAX's coordination service does this: its
preemption notifier catches SIGTERM, and `reached_preemption_sync_point`
tells all processes, at one agreed step, to stop. SIGINT (Ctrl-C) is turned
into SIGTERM so that it takes the same path.
"""

import os
import signal
import threading

import jax
from absl import logging
from jax.experimental import multihost_utils


class StopRequest:
  """Context manager that installs the handlers; call it with each step."""

  def __init__(self):
    self.received = None  # Name of the signal, once one arrived.
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      logging.warning("Not in the main thread: SIGTERM and SIGINT will not "
                      "stop the run cleanly")
      return self
    if jax.process_count() > 1:
      handlers = {signal.SIGINT: self._forward_as_sigterm}
    else:
      handlers = {signal.SIGTERM: self._note, signal.SIGINT: self._note}
    self._previous = {sig: signal.signal(sig, handler)
                      for sig, handler in handlers.items()}
    return self

  def __exit__(self, *exc_info):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def __call__(self, step):
    """True when the run should save and stop after `step`."""
    if jax.process_count() > 1:
      # Every process calls this at every step, as the protocol requires.
      return multihost_utils.reached_preemption_sync_point(step)
    return self.received is not None

  def _note(self, signum, frame):
    del frame
    self.received = signal.Signals(signum).name
    logging.warning("%s received: stopping after the current step",
                    self.received)

  def _forward_as_sigterm(self, signum, frame):
    del signum, frame
    self.received = "SIGINT"
    os.kill(os.getpid(), signal.SIGTERM)
