"""What a run reports while it trains, in one object the loop calls: the
one place a run reports, its parts in this package.

`Report` keeps the run's clocks (timing.py's window of steps, goodput.py's
buckets of wall time), its count of skipped examples
(data/broken_records.py), its progress lines (progress.py) and its metrics
writer (runs/writers.py), and decides what goes in each metrics row: one
row per step at most, so that metrics.jsonl holds each value once. What it
has written last is `last`, the run's result.
"""

import contextlib

import jax
from clu import parameter_overview

from vit_jax.data import broken_records
from vit_jax.runs import writers
from vit_jax.training import throughput
from vit_jax.training.reporting import goodput, progress, timing


def due(step, every, last_step):
  """Whether something done every `every` steps (and at the last) is due."""
  return step % every == 0 or step == last_step


class Report:
  """The loop's reporting, from `start_step` of a run whose checkpoint
  carried `saved` (skipped examples so far), with the run's `accounts`
  (goodput.Accounts, the earlier runs' seconds carried)."""

  def __init__(self, run, program, start_step, saved, resumed, accounts):
    keys = run.settings
    self._mesh = run.mesh
    self._workdir = run.workdir
    self._start_step = self._step = start_step
    self._accounts = accounts
    self._writer = writers.create(run.workdir, start_step)
    self._printer = progress.Progress(keys.total_steps, start_step,
                                      keys.batch_size, keys.log_every,
                                      enabled=jax.process_index() == 0,
                                      unit="seq/s" if run.packing
                                      else "img/s")
    self._skipped = broken_records.Count(saved["skipped_examples"])
    self._window = timing.Window(keys.batch_size, jax.device_count(),
                                 throughput.Throughput(
                                     run.parts.objective.flops_per_image(
                                         keys.image_size,
                                         keys.naflex.max_num_patches or None,
                                         run.packing.slots if run.packing
                                         else 1), keys.batch_size))
    self._row = {}
    self.last = {}
    parameter_overview.log_parameter_overview(
        program.state_shapes.params, include_stats=False,
        msg=f"{keys.model.name}, params sharded over mesh "
        f"{dict(run.mesh.shape)}")
    self._printer.say(progress.describe_run(keys, run.mesh, run.workdir,
                                            start_step, resumed))

  def step(self, step, metrics, log_now):
    """After each step: its metrics (device arrays, not waited for), and
    whether the row of this step carries the training metrics."""
    self._step = step
    self._skipped.add(metrics.pop("skipped_examples"))
    self._window.add(metrics, compiled=step == self._start_step + 1)
    if log_now:
      self._row = {**self._window.row(),
                   "train_skipped_examples": self._skipped.total()}
    # The progress line's loss is the row's: the window's mean, at a step
    # that logs the very value metrics.jsonl holds.
    self._printer.step(step, lambda: self._row["train_loss"] if log_now
                       else self._window.mean("train_loss"))

  def counting(self, bucket):
    """Time inside goes to `bucket` (goodput.BUCKETS)."""
    return self._accounts.counting(bucket)

  @contextlib.contextmanager
  def paused(self, bucket):
    """Time inside goes to `bucket`, and is not the steps' (img/s)."""
    with self._accounts.counting(bucket), self._window.paused():
      yield

  def evaluated(self, step, results):
    """The evaluators' results at `step` ({} when none ran); writes the
    step's row if it has anything."""
    self._printer.results(step, results)
    row, self._row = {**self._row, **results}, {}
    if row:
      seconds = self._accounts.seconds()
      row.update(goodput.metrics(seconds),
                 core_days=timing.core_days(goodput.total(seconds)))
      self._writer.write_scalars(step, row)
      goodput.write_record(self._workdir, step, seconds)
      self.last.update(row)

  def saved_progress(self):
    """What a checkpoint carries besides the state, for the next run."""
    return {"seconds": self._accounts.seconds(),
            "skipped_examples": self._skipped.total(),
            "mesh": dict(self._mesh.shape)}

  def close(self):
    """After the run's last save: the record of its time (goodput.py) and
    the metrics, flushed."""
    self._accounts.switch("other")
    seconds = self._accounts.seconds()
    self.last["time"] = seconds
    goodput.write_record(self._workdir, self._step, seconds)
    self._writer.flush()
