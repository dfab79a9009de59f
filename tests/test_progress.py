"""The progress lines of a run (vit_jax/training/reporting/progress.py), on
a clock the test sets."""

import io

from vit_jax.training.reporting import progress


class Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def run(steps_and_seconds, total=100, start=0, every=10, enabled=True,
        evals=None):
  """Lines printed by a run whose step i ends `seconds` after the last."""
  clock, out = Clock(), io.StringIO()
  printer = progress.Progress(total, start, batch_size=8, every_steps=every,
                              enabled=enabled, out=out, clock=clock)
  for step, seconds in steps_and_seconds:
    clock.now += seconds
    printer.step(step, lambda: 0.5)
    printer.results(step, (evals or {}).get(step, {}))
  return out.getvalue().splitlines()


def test_a_line_every_n_steps_with_rate_and_eta():
  # First step (compiles) takes 20 s, then 1 s per step.
  lines = run([(1, 20.0)] + [(s, 1.0) for s in range(2, 101)])
  assert lines[0] == "step   1/100 | loss 0.5000 | first step (compiles) 20s"
  assert lines[1] == "step  10/100 | loss 0.5000 | 8 img/s | ETA 1m30s"
  assert [line.split("|")[0].strip() for line in lines] == (
      ["step   1/100"] + [f"step {s:>3}/100" for s in range(10, 101, 10)])
  assert lines[-1].endswith("ETA 0s")


def test_a_line_at_least_every_30_seconds():
  # Steps of 12 s, lines due every 100 steps: one line at least every 30 s.
  lines = run([(s, 12.0) for s in range(1, 11)], every=100, total=10)
  assert [line.split("|")[0].strip() for line in lines] == [
      "step  1/10", "step  4/10", "step  7/10", "step 10/10"]
  assert "1 img/s" in lines[1] and "ETA 1m12s" in lines[1]


def test_evaluations_get_a_line_and_do_not_count_as_training_time():
  clock, out = Clock(), io.StringIO()
  printer = progress.Progress(20, 0, batch_size=10, every_steps=10, out=out,
                              clock=clock)
  for step in range(1, 21):
    clock.now += 1.0
    printer.step(step, lambda: 0.25)
    if step == 10:
      clock.now += 100.0  # A long evaluation.
      printer.results(step, {"test_accuracy": 0.875})
  lines = out.getvalue().splitlines()
  assert lines[2] == "step 10/20 | test_accuracy 0.8750"
  assert lines[3].startswith("step 20/20 | loss 0.2500 | 10 img/s")


def test_a_resumed_run_counts_from_where_it_resumed():
  lines = run([(s, 2.0) for s in range(51, 61)], start=50, total=60)
  assert lines[0].startswith("step 51/60 | loss 0.5000 | first step")
  assert lines[1] == "step 60/60 | loss 0.5000 | 4 img/s | ETA 0s"


def test_other_processes_print_nothing():
  assert not run([(s, 1.0) for s in range(1, 21)], enabled=False,
                 evals={10: {"test_accuracy": 0.5}})


def test_durations_read_as_people_write_them():
  assert progress.duration(9.4) == "9s"
  assert progress.duration(84) == "1m24s"
  assert progress.duration(3725) == "1h02m"
