"""A run stopped on one slice resumes on another with the same batches;
a run over two slices (emulated: a process each) trains like one over
one."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.util import (
  REPO,
  finish,
  latest_checkpoint,
  logged,
  logging_batches,
  made_once,
  main_flags,
  pid_of_process,
  run_training,
  small_config,
  wait_for_step,
)
from vit_jax import errors
from vit_jax.data import shares as shares_lib
from vit_jax.runs.workdir import Workdir
from vit_jax.training import loop, resolve

# Pure data parallelism, so that 8, 4 and 2 x 2 devices all run it; the
# test split evaluated once, at the end. SGD, so that params can be
# compared (tests/test_pod.py says why not Adam).
ELASTIC = {"mesh.data": -1, "mesh.model": 1, "total_steps": 20,
           "log_every": 1, "checkpoint_every": 6,
           "evaluators.test.every": 20, "optimizer.name": "sgd",
           "optimizer.learning_rate": 0.1, "optimizer.weight_decay": 0.0}
# Two slices, a process each: data 2 across them, fsdp 4 inside each.
TWO_SLICES = {**ELASTIC, "mesh.slices": 2, "mesh.fsdp": 4}
STOP_AFTER = 12
FINGERPRINTED_MAIN = os.path.join(REPO, "tests", "fingerprinted_main.py")


def start_fingerprinted(args, devices, batch_log):
  """vit_jax.main ARGS on `devices` emulated devices, logging its batches."""
  env = dict(os.environ, BATCH_LOG=batch_log)
  env["XLA_FLAGS"] = " ".join(
      [f for f in env.get("XLA_FLAGS", "").split()
       if not f.startswith("--xla_force_host_platform_device_count")]
      + [f"--xla_force_host_platform_device_count={devices}"])
  return subprocess.Popen(
      [sys.executable, FINGERPRINTED_MAIN, *args], cwd=REPO, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_fingerprinted_pod(num_processes, devices, args, batch_log, tmp):
  """launch/local_pod.sh with each process logging its batches."""
  interpreter = os.path.join(tmp, "python")
  with open(interpreter, "w") as f:  # local_pod.sh runs $PYTHON -m vit_jax.main
    f.write(f'#!/bin/sh\nif [ "$1" = -m ]; then shift 2; set -- '
            f'{FINGERPRINTED_MAIN} "$@"; fi\n'
            f'exec {sys.executable} "$@"\n')
  os.chmod(interpreter, 0o755)
  env = dict(os.environ, BATCH_LOG=batch_log)
  return subprocess.Popen(
      [os.path.join(REPO, "launch", "local_pod.sh"), str(num_processes),
       str(devices), "--", *args], cwd=REPO,
      env=dict(env, PYTHON=interpreter), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True)


def global_batches(batch_log, num_processes=1):
  """{step: fingerprints of the global batch's rows}, the processes' rows
  joined in process order, as the global batch holds them."""
  steps = {}
  for process in range(num_processes):
    with open(f"{batch_log}.{process}") as f:
      for line in f:
        row = json.loads(line)
        steps.setdefault(row["step"], []).extend(row["rows"])
  return steps


@pytest.fixture(scope="module")
def uninterrupted(digits_data_dir, tmp_path_factory):
  """(losses, batch fingerprints, workdir) of the run on 8 devices of one
  slice, data 8, without a break (once for both pytest workers)."""
  config = small_config(digits_data_dir, **ELASTIC)

  def make(tmp):
    real = loop.train_batches
    loop.train_batches = logging_batches(os.path.join(tmp, "batches"), real)
    try:
      run_training(config, os.path.join(tmp, "run"))
    finally:
      loop.train_batches = real
  tmp = made_once(tmp_path_factory, "elastic_uninterrupted", make)
  workdir = os.path.join(tmp, "run")
  return logged(workdir), global_batches(os.path.join(tmp, "batches")), workdir


@pytest.fixture(scope="module")
def stopped(digits_data_dir, tmp_path_factory, uninterrupted):
  """A workdir of the run on 8 devices, 2 hosts of 4 standing for 2
  slices, stopped after step 12 by SIGTERM to one host (as when it is
  preempted), the step it saved and its data_dir (once for both pytest
  workers: the worker that made it read its own digits_data_dir)."""
  tmp = made_once(tmp_path_factory, "elastic_stopped",
                  lambda tmp: stop_on_two_slices(digits_data_dir, tmp,
                                                 uninterrupted))
  workdir = os.path.join(tmp, "run")
  return workdir, max(logged(workdir)), Workdir(workdir).read_config().data_dir


def stop_on_two_slices(digits_data_dir, tmp, uninterrupted):
  workdir = os.path.join(tmp, "run")
  log = os.path.join(tmp, "batches")
  pod = start_fingerprinted_pod(
      2, 4, main_flags(workdir, digits_data_dir, **TWO_SLICES), log, tmp)
  wait_for_step(workdir, STOP_AFTER, pod)
  subprocess.run(["kill", "-TERM", str(pid_of_process(workdir, 1))],
                 check=True)
  code, stdout, stderr = finish(pod)
  assert code == 0, stderr[-3000:]
  step = max(logged(workdir))
  # The hosts agree on one step to stop at; process 0 says which.
  stops = [line for line in stdout.splitlines() if "stopped at step" in line]
  assert len(stops) == 1 and stops[0].startswith(f"[0] stopped at step "
                                                 f"{step}:")
  assert STOP_AFTER <= step < ELASTIC["total_steps"]
  # The pod read the batches of the run on one host of 8 devices, and
  # computed its losses: the gradients summed over fsdp inside each slice,
  # then across the slices.
  batches = global_batches(log, 2)
  assert sorted(batches) == list(range(1, step + 1))
  assert all(batches[s] == uninterrupted[1][s] for s in batches)
  assert "mesh data=2 x fsdp=4 x model=1" in stdout + stderr
  losses = logged(workdir)
  np.testing.assert_allclose([losses[s] for s in batches],
                             [uninterrupted[0][s] for s in batches],
                             rtol=1e-5)


def resumed_copy(stopped, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(stopped[0], workdir)
  return workdir


def assert_continues(workdir, batch_log, num_processes, stopped_at,
                     uninterrupted):
  expected_losses, expected_batches, _ = uninterrupted
  got = logged(workdir)
  after = range(stopped_at + 1, ELASTIC["total_steps"] + 1)
  assert sorted(got) == list(range(1, ELASTIC["total_steps"] + 1))
  batches = global_batches(batch_log, num_processes)
  assert sorted(batches) == list(after)  # Read from the resumed step on.
  for step in after:
    assert batches[step] == expected_batches[step], step
  # The same batches summed in another order (another all-reduce, another
  # split of the batch over devices): float32 rounding, measured at 2.2e-7
  # relative at most over 30 steps; a wrong example moves a loss by
  # about 1e-3.
  np.testing.assert_allclose([got[s] for s in after],
                             [expected_losses[s] for s in after], rtol=1e-5)
  with open(os.path.join(workdir, "config_changes.jsonl")) as f:
    changes, = [json.loads(line)["changes"] for line in f]
  return changes


# Its run, and the pod of two of `stopped` where this test asks for it
# first.
@pytest.mark.processes(3)
def test_a_run_stopped_on_2_slices_resumes_on_1_of_4_devices(
    digits_data_dir, tmp_path, stopped, uninterrupted):
  workdir = resumed_copy(stopped, tmp_path)
  data_dir = stopped[2]
  log = str(tmp_path / "batches")
  code, _, stderr = finish(start_fingerprinted(main_flags(
      workdir, data_dir, **{**TWO_SLICES, "mesh.slices": -1}), 4,
      log))
  assert code == 0, stderr[-3000:]
  changes = assert_continues(workdir, log, 1, stopped[1], uninterrupted)
  assert changes == {
      "devices": {"old": "8 (data=2 x fsdp=4 x model=1)",
                  "new": "4 (data=1 x fsdp=4 x model=1)"},
      "mesh.slices": {"old": 2, "new": -1}}
  assert "devices: '8 (data=2 x fsdp=4 x model=1)' -> '4 (data=1" in stderr
  assert_params_close(workdir, data_dir, uninterrupted)


# Its pod of two, and the pod of two of `stopped` where this test asks for
# it first.
@pytest.mark.processes(4)
def test_a_run_stopped_on_8_devices_resumes_on_2_hosts_of_2(
    tmp_path, stopped, uninterrupted):
  workdir = resumed_copy(stopped, tmp_path)
  data_dir = stopped[2]
  log = str(tmp_path / "batches")
  code, _, stderr = finish(start_fingerprinted_pod(
      2, 2, main_flags(workdir, data_dir, **ELASTIC), log,
      str(tmp_path)))
  assert code == 0, stderr[-3000:]
  changes = assert_continues(workdir, log, 2, stopped[1], uninterrupted)
  assert changes["devices"]["new"] == "4 (data=4 x fsdp=1 x model=1)"
  assert_params_close(workdir, stopped[2], uninterrupted)


def assert_params_close(workdir, data_dir, uninterrupted):
  """The resumed run's final params are the uninterrupted run's, within
  float32 rounding: the same batches summed in other orders (gloo's, then
  another mesh's); a wrong batch or share moves params by 1e-3 or more."""
  config = small_config(data_dir, **ELASTIC)
  _, params, _ = latest_checkpoint(workdir, config)
  _, expected, _ = latest_checkpoint(uninterrupted[2], config)
  np.testing.assert_allclose(
      np.concatenate([x.ravel() for x in jax.tree.leaves(params)]),
      np.concatenate([x.ravel() for x in jax.tree.leaves(expected)]),
      rtol=1e-6, atol=5e-7)


def test_the_default_shares_suit_slices_and_small_datasets():
  # Table 2's pre-training: batch 4096 on ImageNet-21k, one share per core
  # of a v3-2048.
  assert shares_lib.default(4096, 14_197_122, 8) == 2048
  # A fine-tune at batch 512 on CIFAR-10: any slice up to v3-512.
  assert shares_lib.default(512, 50_000, 8) == 512
  # Digits: 16 shares of about 90 examples.
  assert shares_lib.default(128, 1437, 8) == 16
  # A VTAB-1k task: 800 training examples; at least one per device.
  assert shares_lib.default(512, 800, 8) == 8
  assert shares_lib.default(512, 800, 32) == 32


def test_a_mesh_that_cannot_read_the_shares_is_refused(digits_data_dir,
                                                       tmp_path):
  config = small_config(digits_data_dir, input_shares=2)  # data 4 x model 2.
  with pytest.raises(errors.ConfigError, match="input_shares=2 cannot be "
                     "read by 4 data-parallel devices"):
    resolve.run(config, str(tmp_path))
