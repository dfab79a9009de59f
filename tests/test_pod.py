"""A pod of processes on this machine (launch/local_pod.sh) runs like one.

The pod trains packed (config.naflex.packing), the input pipeline that
does the most on each host: each process packs its own shares' images.
Square images' pods: tests/test_elastic.py (a run resumed on 2 hosts
equals it on one) and tests/test_gcs_workdir.py (both processes of a pod
setting a damaged checkpoint aside alike, the workdir on Cloud
Storage; a masked autoencoder's pod there, resumed, trains as one
process does)."""

import subprocess
import time

import jax
import numpy as np
import pytest

from tests.util import (
  finish,
  latest_checkpoint,
  logged,
  main_flags,
  pid_of_process,
  run_training,
  small_config,
  start_pod,
  wait_for_step,
)
from vit_jax.data import sources

# The digits mesh, data 4 x model 2: each process holds two data rows and
# both halves of the model axis. The test split does not divide evenly
# into the 4 shares. SGD: Adam would turn the rounding noise in gradients
# that are exactly zero in exact arithmetic (the attention key biases: a
# softmax ignores a constant added to all its logits) into steps of +-lr,
# so that params from a different summation order differ by 1e-4.
POD = {"total_steps": 16, "log_every": 1, "evaluators.test.every": 8,
       "checkpoint_every": 8, "evaluators.test.split": "test[:357]",
       "optimizer.name": "sgd", "optimizer.learning_rate": 0.1,
       "optimizer.weight_decay": 0.0}


# Digits of mixed sizes, about 2.5 a sequence of 64 patches, in 16 shares:
# 8 a process.
PACKED_POD = {**POD, "dataset": "digits/mixed_sizes", "image_size": 16,
              "naflex.max_num_patches": 64, "naflex.packing": True,
              "naflex.images_per_sequence": 2.5, "input_shares": 16}


@pytest.fixture(scope="module")
def pod_run(digits_data_dir, tmp_path_factory):
  # Prepared here, not by both processes at once.
  sources.lookup(PACKED_POD["dataset"], digits_data_dir)
  workdir = str(tmp_path_factory.mktemp("pod"))
  code, stdout, stderr = finish(start_pod(
      2, 4, main_flags(workdir, digits_data_dir, **PACKED_POD)))
  assert code == 0, stderr[-3000:]
  return workdir, stdout


@pytest.mark.processes(2)  # pod_run's pod of two.
def test_two_processes_of_4_devices_train_like_one_of_8(
    digits_data_dir, tmp_path, pod_run):
  pod_workdir, stdout = pod_run
  # Only process 0 reports.
  assert "[0] test_accuracy" in stdout and "[1] " not in stdout
  config = small_config(digits_data_dir, **PACKED_POD)
  run_training(config, str(tmp_path))

  single, pod = logged(tmp_path), logged(pod_workdir)
  assert sorted(pod) == list(range(1, 17))
  np.testing.assert_allclose([pod[s] for s in sorted(pod)],
                             [single[s] for s in sorted(pod)], rtol=1e-6)
  for key in ("images_per_step", "padding_fraction", "dropped_fraction"):
    assert logged(pod_workdir, key) == logged(tmp_path, key), key
  # Every test example is counted once however the shares fall on hosts.
  assert (logged(pod_workdir, "test_accuracy")
          == logged(tmp_path, "test_accuracy"))
  _, pod_params, _ = latest_checkpoint(pod_workdir, config)
  _, single_params, _ = latest_checkpoint(str(tmp_path), config)
  # Gloo sums the gradients of the two processes in another order than the
  # in-process all-reduce: float32 rounding, a few 1e-8 per step, which 16
  # steps bring to about 1e-7 on params of up to 1 in size. A wrong share or
  # batch would be off by far more than 1e-4.
  np.testing.assert_allclose(
      np.concatenate([x.ravel() for x in jax.tree.leaves(pod_params)]),
      np.concatenate([x.ravel() for x in
                      jax.tree.leaves(single_params)]),
      rtol=1e-6, atol=5e-7)


@pytest.mark.processes(2)  # A pod of two.
def test_a_process_that_dies_takes_the_pod_down_with_no_orphans(
    digits_data_dir, tmp_path):
  workdir = str(tmp_path)
  pod = start_pod(2, 4, main_flags(workdir, digits_data_dir,
                                   **{**POD, "total_steps": 400}))
  wait_for_step(workdir, 2, pod)
  subprocess.run(["kill", "-KILL", str(pid_of_process(workdir, 1))],
                 check=True)
  code, _, stderr = finish(pod, timeout=60)
  assert code != 0
  assert "process" in stderr and "stopping the others" in stderr
  time.sleep(0.5)
  left = subprocess.run(["pgrep", "-f", "--", f"--workdir={workdir} "],
                        capture_output=True, text=True).stdout.split()
  assert not left

