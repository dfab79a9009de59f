"""A jax.profiler trace of a few training steps: config.profile_steps.

"START,COUNT" traces steps START to START + COUNT - 1 on process 0 (every
host runs the same program) into WORKDIR/plugins/profile/RUN/, where
TensorBoard's profile plugin (the `profile` extra) lists it beside the
run's scalars. The trace is written to a local folder first and copied
into the workdir through the path layer, so a gs:// workdir holds it too.
Starting and writing it are timed as goodput's `profile`; the traced steps
stay `train`, a little slower for being traced.
"""

import shutil
import tempfile

import jax
from absl import logging

from vit_jax import errors


def steps(text):
  """The steps "START,COUNT" names (a range), or None for ""."""
  if not text:
    return None
  try:
    start, count = (int(part) for part in text.split(","))
  except ValueError:
    start = count = 0
  if start < 1 or count < 1:
    raise errors.ConfigError(
        f"config.profile_steps must be 'START,COUNT' with both >= 1 (or "
        f"''), got {text!r}")
  return range(start, start + count)


class StepTrace:
  """Starts the trace before the first of `traced` (a range of steps) and
  writes it into `workdir` after the last; does nothing elsewhere."""

  def __init__(self, traced, workdir, accounts):
    self._traced = traced if jax.process_index() == 0 else None
    self._workdir, self._accounts = workdir, accounts
    self._local = None  # The folder being traced into, while tracing.

  def before(self, step):
    if self._traced and step == self._traced.start:
      with self._accounts.counting("profile"):
        self._local = tempfile.mkdtemp(prefix="vit_jax_profile_")
        jax.profiler.start_trace(self._local)

  def after(self, step, metrics):
    """After `step` was dispatched: its `metrics` are waited for when the
    trace ends there."""
    if self._local and step == self._traced[-1]:
      with self._accounts.counting("profile"):
        jax.block_until_ready(metrics)
        self.close()

  def close(self):
    """Ends a trace under way (a run stopped inside it keeps what it
    traced) and copies it into the workdir."""
    if not self._local:
      return
    local, self._local = self._local, None
    try:
      jax.profiler.stop_trace()
      where = self._workdir.add_profile(local)
    finally:
      shutil.rmtree(local, ignore_errors=True)
    logging.info("Profile of steps %d-%d in %s (TensorBoard's profile "
                 "tab)", self._traced.start, self._traced[-1], where)
