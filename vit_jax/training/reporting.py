"""What a run reports while it trains, in one object the loop calls.

`Report` keeps the run's clocks (timing.py), its count of skipped examples
(data/broken_records.py), its progress lines (progress.py) and its metrics
writer (runs/writers.py), and decides what goes in each metrics row: one
row per step at most, so that metrics.jsonl holds each value once. What it
has written last is `last`, the run's result.
"""

import jax
from clu import parameter_overview

from vit_jax.data import broken_records
from vit_jax.models import flops
from vit_jax.runs import writers
from vit_jax.training import progress, timing


def due(step, every, last_step):
  """Whether something done every `every` steps (and at the last) is due."""
  return step % every == 0 or step == last_step


class Report:
  """The loop's reporting, from `start_step` of a run whose checkpoint
  carried `saved` (training seconds and skipped examples so far)."""

  def __init__(self, run, program, start_step, saved, resumed):
    config = run.config
    self._mesh = run.mesh
    self._start_step = start_step
    self._writer = writers.create(run.workdir, start_step)
    self._printer = progress.Progress(config.total_steps, start_step,
                                      config.batch_size, config.log_every,
                                      enabled=jax.process_index() == 0)
    self._clock = timing.RunClock(saved["train_seconds"], jax.device_count())
    self._skipped = broken_records.Count(saved["skipped_examples"])
    self._window = timing.Window(config.batch_size, jax.device_count(),
                                 flops.Throughput(config, run.num_classes))
    self._row = {}
    self.last = {}
    parameter_overview.log_parameter_overview(
        program.state_shapes.params, include_stats=False,
        msg=f"{config.model.name}, params sharded over mesh "
        f"{dict(run.mesh.shape)}")
    self._printer.say(progress.describe_run(config, run.mesh, run.workdir,
                                            start_step, resumed))

  def step(self, step, metrics, log_now):
    """After each step: its metrics (device arrays, not waited for), and
    whether the row of this step carries the training metrics."""
    self._skipped.add(metrics.pop("skipped_examples"))
    self._window.add(metrics, compiled=step == self._start_step + 1)
    if log_now:
      self._row = {**self._window.row(),
                   "train_skipped_examples": self._skipped.total()}
    self._printer.step(step, lambda: float(metrics["train_loss"]))

  def paused(self):
    """Time inside (evaluation, saving) is not the steps'."""
    return self._window.paused()

  def evaluated(self, step, results):
    """The evaluators' results at `step` ({} when none ran); writes the
    step's row if it has anything."""
    self._printer.results(step, results)
    row, self._row = {**self._row, **results}, {}
    if row:
      row["core_days"] = self._clock.core_days()
      self._writer.write_scalars(step, row)
      self.last.update(row)

  def saved_progress(self):
    """What a checkpoint carries besides the state, for the next run."""
    return {"train_seconds": self._clock.seconds(),
            "skipped_examples": self._skipped.total(),
            "mesh": dict(self._mesh.shape)}

  def close(self):
    self._writer.flush()
