"""Progress lines on stdout while a run trains (process 0 only).

  step   50/1000 | loss 1.8421 | 3,410 img/s | ETA 1m24s
  step  250/1000 | test_accuracy 0.9472

A line comes every `every_steps` steps, at least every `every_seconds`
(when a step ends), at the first step (which compiles) and at the last;
and one with the evaluators' results whenever they run. Its loss is the
mean training loss of the steps since the last metrics row: at a step
that logs, the train_loss of metrics.jsonl. Plain lines rather than a redrawn bar: they
read the same in a terminal, a log file and a pod's prefixed output.
"""

import sys
import time

from vit_jax import sharding

EVERY_SECONDS = 30


def describe_run(keys, mesh, workdir, start_step, resumed):
  """The line a run of `keys` (runs.settings.Settings) starts with: what
  trains where, or where it resumes."""
  what = (f"Resuming at step {start_step} of {keys.total_steps}" if resumed
          else f"Training {keys.model.name} on {keys.dataset} for "
          f"{keys.total_steps} steps")
  if resumed and keys.init_from:
    what += " (from the workdir's own checkpoint, not init_from)"
  return (f"{what}: batch {keys.batch_size}, {mesh.size} devices (mesh "
          f"{sharding.describe_mesh(mesh.shape)}), workdir {workdir}")


def scores(results):
  """"name value" for each result: fractions to 4 decimals, counts whole."""
  return [f"{name} {value:.4f}" if isinstance(value, float) else
          f"{name} {value}" for name, value in results.items()]


def duration(seconds):
  """3725 -> '1h02m', 84 -> '1m24s', 9.4 -> '9s'."""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f"{hours}h{minutes:02d}m"
  if minutes:
    return f"{minutes}m{seconds:02d}s"
  return f"{seconds}s"


class Progress:
  """Decides when to print a line, and prints it."""

  def __init__(self, total_steps, start_step, batch_size, every_steps,
               every_seconds=EVERY_SECONDS, enabled=True, out=None,
               clock=time.monotonic, unit="img/s"):
    self._total = total_steps
    self._start_step = start_step
    self._batch_size = batch_size  # Of examples: images, or sequences.
    self._unit = unit
    self._every_steps = every_steps
    self._every_seconds = every_seconds
    self._enabled = enabled
    self._out = out
    self._clock = clock
    self._width = len(str(total_steps))
    # Rates count from the end of the first step: it compiles.
    self._rate_start = None  # (step, time)
    self._last_line = (start_step, clock())

  def say(self, text):
    """A line of its own (the run's start, a resume, a stop)."""
    if self._enabled:
      print(text, file=self._out or sys.stdout, flush=True)

  def step(self, step, loss):
    """Called after every step. `loss` gives the training loss to show, the
    mean of the steps since the last metrics row (called only when a line
    is printed: it waits for the steps)."""
    now = self._clock()
    first = step == self._start_step + 1
    if first:
      self._rate_start = (step, now)
    due = (first or step == self._total or step % self._every_steps == 0
           or now - self._last_line[1] >= self._every_seconds)
    if not (due and self._enabled):
      return
    parts = [f"step {step:>{self._width}}/{self._total}",
             f"loss {loss():.4f}"]
    if first:
      parts.append(f"first step (compiles) {duration(now - self._last_line[1])}")
    else:
      steps, seconds = step - self._last_line[0], now - self._last_line[1]
      if steps and seconds > 0:
        parts.append(f"{steps * self._batch_size / seconds:,.0f} "
                     f"{self._unit}")
      eta = self.eta(step, now)
      if eta is not None:
        parts.append(f"ETA {duration(eta)}")
    self.say(" | ".join(parts))
    self._last_line = (step, now)

  def results(self, step, results):
    """The evaluators' results at `step`, if any ran."""
    if results:
      self.say(" | ".join([f"step {step:>{self._width}}/{self._total}",
                           *scores(results)]))
      # The next line's img/s counts training only.
      self._last_line = (step, self._clock())

  def eta(self, step, now):
    """Seconds to the last step at the pace since the first one ended."""
    if self._rate_start is None or step <= self._rate_start[0]:
      return None
    pace = (now - self._rate_start[1]) / (step - self._rate_start[0])
    return pace * (self._total - step)
