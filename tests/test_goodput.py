"""Every second of a run's wall time in one bucket
(training/reporting/goodput.py), across restarts: SIGTERM twice, and kill
-9 with steps redone."""

import argparse
import json
import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import pytest
from tensorboard.plugins import base_plugin
from xprof import profile_plugin

from tests.util import (
  call_tool,
  finish,
  latest_checkpoint,
  main_flags,
  metric_rows,
  small_config,
  start_main,
  wait_for_step,
)
from vit_jax.runs import lock
from vit_jax.runs.workdir import Workdir
from vit_jax.training.reporting import goodput

RUN = {"total_steps": 40, "log_every": 1, "checkpoint_every": 10,
       "evaluators.test.every": 20}


def test_compiles_are_taken_out_of_the_bucket_they_happen_in():
  # Checked against clocks read around each switch and against JAX's own
  # compile spans, not against windows that a slow or busy machine misses.
  # The accounts count this thread's compiles: a thread that an earlier
  # test left running in this process may compile meanwhile.
  spans, this_thread = [], threading.get_ident()

  def compiled(event, start, end, **_):
    if (event in goodput.COMPILE_EVENTS
        and threading.get_ident() == this_thread):
      spans.append(end - start)

  jax.monitoring.register_event_time_span_listener(compiled)
  accounts = goodput.Accounts()
  try:
    before_train = time.time()
    accounts.switch("train")
    after_train = time.time()
    time.sleep(0.2)
    # A program not compiled before in this process: its shape is new.
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 1)(jnp.ones((7, 13, 5)))
    before_eval = time.time()
    with accounts.counting("eval"):
      after_eval = time.time()
      time.sleep(0.1)
      before_back = time.time()
    after_back = time.time()
    seconds = accounts.seconds()
    after_seconds = time.time()
  finally:
    accounts.close()
    jax.monitoring.unregister_event_time_span_listener(compiled)
  # The jit's trace, lowering and compile, one after another on this thread.
  assert spans
  assert seconds["compile"] == pytest.approx(sum(spans), rel=1e-6)
  # The train bucket held from the switch to "train" to the switch to
  # "eval", less the compile: counted twice, it would overshoot the bound.
  assert seconds["train"] >= 0.2
  # Within a millisecond: JAX times its compile spans with a clock of its
  # own, which the train bucket gives back. Leaving `counting` switched back
  # to train, which holds the moments up to `seconds()` too (milliseconds
  # where the other worker has the core).
  slack = 1e-3
  assert (before_eval - after_train - slack
          <= seconds["train"] + seconds["compile"]
          <= after_eval - before_train + after_seconds - before_back + slack)
  assert 0.1 <= seconds["eval"] <= after_back - before_eval
  assert before_back - after_eval <= seconds["eval"]
  assert seconds["lost"] == seconds["input"] == 0


def test_what_a_run_did_after_its_checkpoint_is_carried_or_lost():
  at_checkpoint = {**goodput.zeros(), "train": 100.0, "compile": 10.0}
  later = {**at_checkpoint, "train": 130.0, "checkpoint": 2.0}
  # The run trained past step 50 after saving it: those 32 s are redone.
  assert goodput.carried(at_checkpoint, 50, {"step": 60, "seconds": later}
                         ) == {**at_checkpoint, "lost": 32.0}
  # It stopped at 50 and finished saving: each bucket keeps its part.
  assert goodput.carried(at_checkpoint, 50, {"step": 50, "seconds": later}
                         ) == later
  # No record, an older one, or one that does not follow the checkpoint.
  for record in (None, {"step": 40, "seconds": later},
                 {"step": 60, "seconds": goodput.zeros()}):
    assert goodput.carried(at_checkpoint, 50, record) == at_checkpoint
  # A checkpoint from before the buckets carries one total.
  assert goodput.saved({"train_seconds": 7.0}) == {**goodput.zeros(),
                                                   "other": 7.0}


def timed_run(args, stop_at=None, how=signal.SIGTERM, workdir=None):
  """(wall seconds, stdout) of one `vit_jax.main` process, sent `how` once
  it has logged step `stop_at` and its saves before it are complete."""
  start = time.time()
  process = start_main(args)
  if stop_at is not None:
    wait_for_step(workdir, stop_at, process)
    saved = stop_at // RUN["checkpoint_every"] * RUN["checkpoint_every"]
    while saved and saved not in Workdir(workdir).checkpoint_steps():
      time.sleep(0.01)
    process.send_signal(how)
  code, stdout, stderr = finish(process)
  assert code == (-how if how == signal.SIGKILL and stop_at else 0), (
      stderr[-3000:])
  return time.time() - start, stdout


def record(workdir):
  return Workdir(workdir).read_time()


# The run, stopped, and its resume: a process each (their wall times are
# what the buckets add up to).
@pytest.mark.processes(2)
def test_a_stop_and_a_resume_buckets_add_up_to_the_wall_time(
    digits_data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  # The first run also traces steps 3 and 4 (training/profiling.py).
  args = [*main_flags(workdir, digits_data_dir, **RUN,
                      profile_steps="3,2"),
          f"--compilation_cache={tmp_path / 'cache'}"]
  walls, train_steps_cached = [], []
  for stop_at in (8, None):
    wall, stdout = timed_run(args, stop_at, workdir=workdir)
    walls.append(wall)
    # JAX names a cached program by its function and its key's hash.
    train_steps_cached.append(sorted(
        name for name in os.listdir(tmp_path / "cache")
        if name.startswith("jit_train_step")))
  seconds = record(workdir)["seconds"]
  assert record(workdir)["step"] == RUN["total_steps"]
  assert set(seconds) == set(goodput.BUCKETS)
  assert goodput.total(seconds) == pytest.approx(sum(walls), rel=0.02)
  # SIGTERM saves at the step it stops at: nothing is trained twice.
  assert seconds["lost"] == 0
  for bucket in ("startup", "compile", "train", "input", "checkpoint",
                 "eval", "profile"):
    assert seconds[bucket] > 0, bucket
  # TensorBoard's profile plugin lists the trace, one run of it.
  plugin = profile_plugin.ProfilePlugin(base_plugin.TBContext(
      logdir=workdir, data_provider=None,
      flags=argparse.Namespace(master_tpu_unsecure_channel="")))
  (run,) = plugin.generate_runs()
  assert plugin._get_xplane_basenames(  # pylint: disable=protected-access
      plugin._run_to_profile_run_dir[run])  # pylint: disable=protected-access
  # The resume's train step is the program the first run cached: the
  # same key, so it is read back, not compiled and written anew.
  assert train_steps_cached[0]
  assert train_steps_cached[1] == train_steps_cached[0]
  # The rows carry the buckets, cumulative across the restart.
  rows = [r for r in metric_rows(workdir) if "time/train" in r]
  assert [r["step"] for r in rows] == list(range(1, 41))
  totals = [sum(r[goodput.METRIC_PREFIX + b] for b in goodput.BUCKETS)
            for r in rows]
  assert totals == sorted(totals)
  assert rows[-1]["core_days"] == pytest.approx(
      totals[-1] * 8 / 86_400, rel=1e-6)
  assert "train" in stdout.splitlines()[-1]  # The summary line.


def test_steps_redone_after_kill_9_are_lost(digits_data_dir, tmp_path):
  """And the workdir's lock, left behind by the killed process, is taken
  over by the next run, which releases it."""
  workdir = str(tmp_path / "run")
  args = main_flags(workdir, digits_data_dir, **RUN)
  timed_run(args, 15, signal.SIGKILL, workdir)
  with open(os.path.join(workdir, lock.LOCK_FILE)) as f:
    killed = json.load(f)["pid"]
  with pytest.raises(ProcessLookupError):
    os.kill(killed, 0)  # Its holder is gone.
  config = small_config(digits_data_dir, **RUN)
  saved_at, _, progress = latest_checkpoint(workdir, config)
  last = record(workdir)
  assert last["step"] > saved_at >= 10
  # What the killed run's rows say it did after the checkpoint's row: its
  # steps, and the save of the checkpoint with its compiles.
  rows = {r["step"]: r for r in metric_rows(workdir)}
  after = {b: rows[last["step"]][goodput.METRIC_PREFIX + b]
           - rows[saved_at][goodput.METRIC_PREFIX + b]
           for b in goodput.BUCKETS}
  assert after["train"] > 0

  # The resume, in this process: what it adds up is read from the records,
  # not from a process's wall time.
  code, stdout, stderr = call_tool("main", *args)
  assert code == 0, stderr[-3000:]
  assert "Resuming at step" in stdout
  assert not os.path.exists(os.path.join(workdir, lock.LOCK_FILE))
  seconds = record(workdir)["seconds"]
  lost = goodput.total(last["seconds"]) - goodput.total(progress["seconds"])
  assert seconds["lost"] == pytest.approx(lost, abs=1e-6)
  # The checkpoint's seconds were read just after its row was written.
  assert seconds["lost"] == pytest.approx(goodput.total(after), abs=0.2)
