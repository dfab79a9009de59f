"""The steps' clock, and the unit of a run's cost.

`Window`: the steps since the last metrics row, their mean metrics and
their images per second, counting neither the first step of a process
(it compiles) nor time spent between steps (evaluation, checkpoints).
`core_days`: what seconds of wall time cost on the devices (goodput.py
keeps a workdir's seconds).
"""

import contextlib
import time

import jax
import numpy as np

from vit_jax.training import throughput as throughput_lib


class Window:
  """Metrics of the steps since the last `row`, and their throughput."""

  def __init__(self, batch_size, num_devices, throughput):
    self._batch_size = batch_size
    self._num_devices = num_devices
    self._throughput = throughput  # Throughput: img/s -> FLOPs, MFU.
    self._metrics, self._start, self._steps = [], time.time(), 0

  def add(self, metrics, compiled=False):
    """One step's metrics; `compiled` for a step that compiled the program,
    whose time is left out once it has finished."""
    self._metrics.append(metrics)
    self._steps += 1
    if compiled:
      jax.block_until_ready(metrics)
      self._start, self._steps = time.time(), 0

  @contextlib.contextmanager
  def paused(self):
    """Time spent inside is not the steps'."""
    paused = time.time()
    try:
      yield
    finally:
      self._start += time.time() - paused

  def mean(self, name):
    """The mean of the metric `name` over the window's steps so far, as
    `row` gives it (it waits for them); the window goes on."""
    return float(np.mean(jax.device_get([m[name] for m in self._metrics])))

  def row(self):
    """The window's mean metrics and img/s per device (and a packed run's
    sequences a second); starts a new one."""
    row = jax.tree.map(lambda *x: float(np.mean(x)),
                       *jax.device_get(self._metrics))
    if self._steps:
      # A batch's examples: its images, or a packed batch's sequences,
      # whose images the step counts ("images_per_step").
      per_device = (self._steps * self._batch_size
                    / (time.time() - self._start) / self._num_devices)
      row["img_per_sec_per_device"] = per_device
      if "images_per_step" in row:
        row["seq_per_sec_per_device"] = per_device
        row["img_per_sec_per_device"] = (
            per_device * row["images_per_step"] / self._batch_size)
      row.update(self._throughput.metrics(per_device))
    self._metrics, self._start, self._steps = [], time.time(), 0
    return row


def core_days(seconds, num_devices=None):
  """Device-days of `seconds` on `num_devices` (default: all JAX sees)."""
  num_devices = num_devices or jax.device_count()
  return seconds * num_devices / throughput_lib.SECONDS_PER_DAY
