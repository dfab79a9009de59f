"""Restarts are safe: SIGTERM, kill -9 mid-save and a NaN lose nothing."""

import errno
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests.test_random_access import full_disk
from tests.util import (
  REPO,
  assert_trees_equal,
  call_tool,
  finish,
  latest_checkpoint,
  made_once,
  main_flags,
  metric_rows,
  poison_step,
  run_training,
  small_config,
  start_main,
  wait_for_step,
)
from vit_jax import errors

# With the from-scratch recipe's draws, keyed by (seed, example) and
# (seed, step): a resume must draw them as they were.
# (tests/test_elastic.py resumes runs without them.)
LONG = {"total_steps": 60, "log_every": 1, "evaluators.test.every": 30,
        "checkpoint_every": 25, "randaugment": "2,10", "mixup.prob": 0.4,
        "cutmix.prob": 0.4, "label_smoothing": 0.1}


# From a stop signal to the process's exit, at most: the steps it finishes,
# its save, its last row and an evaluation falling due at that step took
# 2.4 s here (the signal after step 29, stopped at 30, which evaluates);
# the rest is room for a loaded machine.
STOP_SECONDS = 10


@pytest.fixture(scope="module")
def uninterrupted(digits_data_dir, tmp_path_factory):
  """Final params of the LONG run, trained without a break (once for both
  pytest workers)."""
  config = small_config(digits_data_dir, **LONG)
  workdir = made_once(tmp_path_factory, "preemption_uninterrupted",
                      lambda path: run_training(config, path))
  step, params, _ = latest_checkpoint(workdir, config)
  assert step == LONG["total_steps"]
  return config, params


def test_sigterm_saves_at_the_next_step_and_resumes_bitwise(
    digits_data_dir, tmp_path, uninterrupted, request):
  """With RandAugment, Mixup, CutMix and label smoothing on."""
  config, expected = uninterrupted
  workdir = str(tmp_path)
  args = main_flags(workdir, digits_data_dir, **LONG)
  # Drawn from the test's name: the same step on every run, so that a
  # failure at it can be run again.
  signal_at = random.Random(request.node.name).randint(3, 45)
  run = start_main(args)
  wait_for_step(workdir, signal_at, run)
  run.send_signal(signal.SIGTERM)
  signalled = time.monotonic()
  # The loop writes a step's row before it runs the next step: when the
  # signal came it was at most one step past the last row read now (read
  # after the signal, it may hold rows written since).
  last_row = max(r["step"] for r in metric_rows(workdir))
  code, stdout, stderr = finish(run)
  stopping = time.monotonic() - signalled
  assert code == 0, stderr[-3000:]
  stopped, _, _ = latest_checkpoint(workdir, config)
  # Saved at the step boundary after the signal, not at a periodic save:
  # the step it was in, or the one after where it had just asked.
  assert signal_at <= stopped <= last_row + 2, (signal_at, last_row)
  # Then it exits: the rest of those steps, a save and a row.
  assert stopping < STOP_SECONDS, stopping
  assert f"stopped at step {stopped}" in stdout
  assert max(r["step"] for r in metric_rows(workdir)) == stopped

  # The resume, in this process: the stop above is what needs one.
  code, stdout, stderr = call_tool("main", *args)
  assert code == 0, stderr[-3000:]
  step, params, _ = latest_checkpoint(workdir, config)
  assert step == LONG["total_steps"]
  assert_trees_equal(params, expected)
  losses = [r["step"] for r in metric_rows(workdir) if "train_loss" in r]
  assert losses == list(range(1, LONG["total_steps"] + 1))
  # One row per step, evaluations and the resume included.
  steps = [r["step"] for r in metric_rows(workdir)]
  assert steps == list(range(1, LONG["total_steps"] + 1))
  assert [r["step"] for r in metric_rows(workdir) if "test_accuracy" in r] == [
      30, 60]


# Runs vit_jax.main through the tools' entry wrapper (quiet: nothing reads
# its pipes before the kill, and a full pipe would stop it) with orbax's
# final rename of one step's checkpoint held back, after a marker file says
# that the step's data is being written.
HOLD_SAVE = """
import asyncio, os, sys
from orbax.checkpoint._src.path import atomicity
step, marker = sys.argv[1:3]
real_finalize = atomicity.AtomicRenameTemporaryPath.finalize
async def finalize(self):
  if os.path.basename(str(self._final_path)) == step:
    open(marker, "w").close()
    await asyncio.sleep(3600)
  return await real_finalize(self)
atomicity.AtomicRenameTemporaryPath.finalize = finalize
from vit_jax import cli, main
sys.argv = ["vit_jax.main"] + sys.argv[3:]
cli.run(main.main)
"""


def test_kill_9_during_a_save_keeps_the_previous_checkpoint(
    digits_data_dir, tmp_path, uninterrupted):
  config, expected = uninterrupted
  workdir = str(tmp_path / "run")
  args = main_flags(workdir, digits_data_dir, **LONG)
  marker = str(tmp_path / "saving")
  run = subprocess.Popen(
      [sys.executable, "-c", HOLD_SAVE, "50", marker, *args], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while not os.path.exists(marker):
    assert run.poll() is None, run.stderr.read()[-3000:]
    if time.time() > deadline:  # A hang fails here, not at CI's limit.
      run.kill()
      raise AssertionError("step 50's save never reached its rename: "
                           f"{run.communicate()[1][-3000:]}")
    time.sleep(0.01)  # Not a spin: the run needs the cores.
  run.kill()  # SIGKILL: no handler, no cleanup.
  run.communicate()
  checkpoints = os.listdir(os.path.join(workdir, "checkpoints"))
  # Step 50's arrays were on disk, under a temporary name, when it died.
  assert any(name.startswith("50.") for name in checkpoints), checkpoints
  step, _, _ = latest_checkpoint(workdir, config)
  assert step == 25

  code, _, stderr = call_tool("main", *args)  # The resume, in this process.
  assert code == 0, stderr[-3000:]
  step, params, _ = latest_checkpoint(workdir, config)
  assert step == LONG["total_steps"]
  assert_trees_equal(params, expected)


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    digits_data_dir, tmp_path, monkeypatch):
  poison_step(monkeypatch, 5)
  config = small_config(digits_data_dir, total_steps=12, log_every=1,
                        checkpoint_every=2,
                        **{"evaluators.test.every": 12})
  with pytest.raises(errors.RunError, match="train_loss is nan at step 5"
                     ) as stopped:
    run_training(config, str(tmp_path))
  step, params, _ = latest_checkpoint(str(tmp_path), config)
  assert step == 4
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  rows = metric_rows(tmp_path)
  assert max(r["step"] for r in rows if "train_loss" in r) == 4
  assert all(np.isfinite(v) for r in rows for v in r.values())
  # Told from the numbers: sane params at step 4, a sudden NaN after.
  message = str(stopped.value)
  assert "The checkpoint of step 4 that it saved last is sane" in message
  assert f"--config.init_from={tmp_path}:4 and " in message, message
  assert "blew up" not in message and "\n" not in message


def test_a_blown_up_run_is_told_so_before_and_after_a_resume(
    digits_data_dir, tmp_path):
  # Adam's first update at a learning rate of 1e9 moves every param by about
  # 1e9: the checkpoint of step 1 holds that (its fingerprints hold: it is
  # what was saved), and the loss turns NaN a step or two later.
  config = small_config(digits_data_dir, total_steps=40, log_every=1,
                        checkpoint_every=1, **{
                            "evaluators.test.every": 0,
                            "optimizer.learning_rate": 1e9,
                            "optimizer.warmup_steps": 0})
  for _ in range(2):  # The second time, a step after resuming.
    with pytest.raises(errors.RunError) as stopped:
      run_training(config, str(tmp_path))
    message = str(stopped.value)
    nan_step = int(re.match(r"train_loss is nan at step (\d+): ",
                            message).group(1))
    assert re.search(
        rf"The run blew up before it: the checkpoint of step {nan_step - 1} "
        r"already holds (params up to \d\.\de\+\d\d|values that are not "
        r"finite) ", message), message
    assert ("Start again in a new --workdir with "
            "--config.optimizer.learning_rate=1e+08 or lower") in message
    assert "suspect" not in message


def fail_save_of(monkeypatch, step):
  """Makes the save of checkpoint `step` fail as on a full disk, as it is
  made whole (orbax's rename of its temporary folder, in orbax's background
  thread, where the failure of a real save happens too)."""
  from orbax.checkpoint._src.path import atomicity  # pylint: disable=g-import-not-at-top
  real_finalize = atomicity.AtomicRenameTemporaryPath.finalize

  async def finalize(self):
    if os.path.basename(str(self._final_path)) == str(step):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                    str(self._final_path))
    return await real_finalize(self)
  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize",
                      finalize)

# Saves at 20, 40 and 60; the params at 60 are those of `uninterrupted`.
SAVES_EVERY_20 = {**LONG, "checkpoint_every": 20}


def assert_stopped_by_a_full_disk(stderr):
  lines = stderr.strip().splitlines()
  assert lines[0].startswith("error: ") and len(lines) <= 3, stderr[-3000:]
  assert "No space left on device" in stderr
  assert "Traceback" not in stderr


def assert_resumes_to_the_end(workdir, args, config, expected):
  # The resume, in this process: the stop before it is what needs one.
  code, stdout, stderr = call_tool("main", *args)
  assert code == 0, stderr[-3000:]
  assert "Resuming at step 20 of 60" in stdout
  step, params, _ = latest_checkpoint(workdir, config)
  assert step == LONG["total_steps"]
  assert_trees_equal(params, expected)
  steps = [r["step"] for r in metric_rows(workdir)]
  assert steps == list(range(1, LONG["total_steps"] + 1))


def test_a_save_that_fails_stops_the_run_at_once_and_it_resumes(
    digits_data_dir, tmp_path, uninterrupted, monkeypatch):
  # In this process (the real full disk, below, is a process's).
  config, expected = uninterrupted
  workdir = str(tmp_path / "run")
  args = main_flags(workdir, digits_data_dir, **SAVES_EVERY_20)
  with monkeypatch.context() as failing:
    fail_save_of(failing, 40)
    code, _, stderr = call_tool("main", *args)
  assert code == 2, stderr[-3000:]
  assert_stopped_by_a_full_disk(stderr)
  assert f"could not save a checkpoint in {workdir}/checkpoints" in stderr
  assert "the checkpoint of step 20 is complete" in stderr
  # Within steps of the failure, not at the next save (60) as before.
  assert 40 <= max(r["step"] for r in metric_rows(workdir)) < 60
  step, _, _ = latest_checkpoint(workdir, config)
  assert step == 20
  assert_resumes_to_the_end(workdir, args, config, expected)


def test_a_full_disk_stops_the_run_and_keeps_the_last_checkpoint(
    digits_data_dir, tmp_path, uninterrupted):
  # The real thing behind the test above (whose restart covers this one's):
  # tensorstore's and TensorBoard's own errors on a disk that is full.
  config, _ = uninterrupted
  # Room for the first checkpoint (about 0.5 MB) but not for a second one.
  with full_disk(tmp_path / "disk", "800k") as disk:
    workdir = os.path.join(disk, "run")
    args = main_flags(workdir, digits_data_dir, **SAVES_EVERY_20)
    code, _, stderr = finish(start_main(args))
    assert code == 2, stderr[-3000:]
    assert_stopped_by_a_full_disk(stderr)
    step, _, _ = latest_checkpoint(workdir, config)
    assert step == 20


@pytest.mark.parametrize("how,when", [(signal.SIGINT, "starting"),
                                      (signal.SIGTERM, "holding the lock")])
def test_a_signal_before_the_loop_stops_in_one_line_and_frees_the_workdir(
    digits_data_dir, tmp_path, how, when):
  workdir = str(tmp_path)
  run = start_main(main_flags(workdir, digits_data_dir))
  lock = os.path.join(workdir, "lock.json")
  if when == "starting":
    time.sleep(2)  # Importing JAX and TensorFlow.
  else:  # Making the initial state, before the first step.
    while not os.path.exists(lock) and run.poll() is None:
      time.sleep(0.005)
  run.send_signal(how)
  code, stdout, stderr = finish(run)
  assert code == 128 + how, stderr[-3000:]
  assert stderr.splitlines() == [
      f"error: stopped by {how.name}; files written so far are whole: run "
      "the same command again"], stderr[-3000:]
  assert "step 1/" not in stdout
  assert not os.path.exists(lock)
