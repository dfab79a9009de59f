"""Where a run's wall time goes: every second of it in one bucket.

  startup     from the process's start to the first step, less what the
              buckets below take of it
  compile     tracing, lowering and compiling XLA programs, or loading them
              from the persistent compilation cache, wherever they happen
  train       the steps: dispatching them and waiting for the devices
  input       waiting for the next batch and placing it on the devices
  checkpoint  restoring, starting saves and waiting for them to finish
  eval        the evaluators, less their compiles
  profile     starting a trace of config.profile_steps and writing it
  lost        what a run did after the checkpoint that the next run resumed
              from: steps trained, then trained again
  other       the rest: the end of a run, after its last save

The buckets are cumulative over a workdir's runs: each checkpoint carries
them, and the workdir's time.json holds them as they were when a run last
wrote a metrics row or ended, so that the next run adds what came after
its checkpoint (to `lost` when steps were redone). Only the clock is read: no
device is waited for that the loop would not wait for anyway.
"""

import contextlib
import os
import threading
import time

import jax

BUCKETS = ("startup", "compile", "train", "input", "checkpoint", "eval",
           "profile", "lost", "other")
# JAX's time spans of the three stages of making a program; a cache hit is
# timed as a backend compile.
COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                            "/jax/core/compile/jaxpr_to_mlir_module_duration",
                            "/jax/core/compile/backend_compile_duration"})
# The metrics rows' names of the buckets, in seconds.
METRIC_PREFIX = "time/"


def zeros():
  return dict.fromkeys(BUCKETS, 0.0)


def process_start():
  """When this process started (time.time()'s clock), or None where /proc
  does not tell: the interpreter's start and imports belong to `startup`
  too. Uptime is read rather than the boot time, whose unit is a second."""
  try:
    with open("/proc/self/stat") as f:
      # Field 22, start time in clock ticks after boot; fields after the
      # command name, which may hold spaces, count from field 3.
      ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None
  return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


class Accounts:
  """This process's buckets since `since` (default: now), plus those its
  workdir's earlier runs carried (`carry`). Time goes to the bucket last
  switched to, less the compiles that JAX reports on this thread."""

  def __init__(self, since=None):
    self._seconds = zeros()
    self._bucket = "startup"
    self._mark = time.time() if since is None else since
    self._compiles = []  # (start, end) since the mark
    self._thread = threading.get_ident()
    jax.monitoring.register_event_time_span_listener(self._compiled)

  def _compiled(self, event, start, end, **_):
    if event in COMPILE_EVENTS and threading.get_ident() == self._thread:
      self._compiles.append((start, end))

  def _charge(self):
    """Moves the time since the mark into its buckets."""
    now = time.time()
    compiled, reached = 0.0, self._mark
    # Tracing nests (a jit inside a jit): the spans' union is counted.
    for start, end in sorted(self._compiles):
      start, end = max(start, reached), min(end, now)
      if end > start:
        compiled += end - start
        reached = end
    self._compiles = []
    self._seconds["compile"] += compiled
    self._seconds[self._bucket] += max(now - self._mark - compiled, 0.0)
    self._mark = now

  def switch(self, bucket):
    """Time from now on goes to `bucket`; returns the bucket before."""
    self._charge()
    previous, self._bucket = self._bucket, bucket
    return previous

  @contextlib.contextmanager
  def counting(self, bucket):
    """Time inside goes to `bucket`, then to the bucket before."""
    previous = self.switch(bucket)
    try:
      yield
    finally:
      self.switch(previous)

  def carry(self, earlier):
    """Adds the seconds of the workdir's earlier runs."""
    for bucket, seconds in earlier.items():
      self._seconds[bucket] += seconds

  def seconds(self):
    """Each bucket's seconds, up to now."""
    self._charge()
    return dict(self._seconds)

  def close(self):
    jax.monitoring.unregister_event_time_span_listener(self._compiled)


def total(seconds):
  return sum(seconds.values())


def metrics(seconds):
  """The buckets as a metrics row's values, and the share that trained."""
  whole = total(seconds)
  return {**{METRIC_PREFIX + b: seconds[b] for b in BUCKETS},
          "goodput": seconds["train"] / whole if whole else 0.0}


def describe(seconds):
  """'train 41s (68%), compile 9s (15%), ...': the buckets that hold a
  second or more, largest first."""
  whole = total(seconds)
  shown = sorted((b for b in BUCKETS if seconds[b] >= 1), key=seconds.get,
                 reverse=True)
  return ", ".join(f"{b} {seconds[b]:,.0f}s ({seconds[b] / whole:.0%})"
                   for b in shown)


def saved(progress):
  """The buckets a checkpoint's progress carries. A checkpoint from before
  them carries its run's wall time in one number: `other`."""
  if "seconds" in progress:
    return {**zeros(), **progress["seconds"]}
  return {**zeros(), "other": float(progress.get("train_seconds", 0.0))}


def carried(checkpoint_seconds, checkpoint_step, record):
  """The buckets a run resumed from a checkpoint of `checkpoint_step`
  starts with: the checkpoint's, plus what the workdir's last run did
  after saving it, as its `record` (read_record's) shows. If that run
  trained past the checkpoint, all of it is lost; otherwise (it stopped
  there, and finished its save) each bucket keeps its part."""
  if record is None or record["step"] < checkpoint_step:
    return checkpoint_seconds
  after = {b: record["seconds"].get(b, 0.0) - checkpoint_seconds[b]
           for b in BUCKETS}
  if min(after.values()) < 0:  # Not this checkpoint's successor.
    return checkpoint_seconds
  if record["step"] > checkpoint_step:
    return {**checkpoint_seconds,
            "lost": checkpoint_seconds["lost"] + total(after)}
  return {b: checkpoint_seconds[b] + after[b] for b in BUCKETS}


def read_record(workdir):
  """{"step", "seconds"} as the workdir's last run last wrote them, or None."""
  try:
    record = workdir.read_time()
    return {"step": int(record["step"]),
            "seconds": {b: float(record["seconds"].get(b, 0.0))
                        for b in BUCKETS}}
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return None  # No run has written one, or a damaged one: start anew.


def write_record(workdir, step, seconds):
  if jax.process_index() == 0:
    workdir.write_time({"step": step, "seconds": seconds})
