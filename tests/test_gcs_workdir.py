"""A run whose workdir is on Cloud Storage (the local one of tests/gcs.py)
trains, stops, resumes and is read by every tool as a local one is; nothing
of it lands on the local disk under a folder named `gs:`."""

import json
import os
import re
import signal
import threading
import time
import unittest.mock

import numpy as np
import pytest
from etils import epath

from tests import gcs
from tests.util import (
  REPO,
  assert_trees_equal,
  finish,
  latest_checkpoint,
  logged,
  main_flags,
  metric_rows,
  run_tool,
  run_training,
  small_config,
  start_main,
  start_pod,
  wait_for_step,
)
from vit_jax.runs import lock
from vit_jax.weights import npz, pretrained

# Long enough to be stopped between two saves.
RUN = {"total_steps": 12, "log_every": 1, "checkpoint_every": 5,
       "evaluators.test.every": 6}


@pytest.fixture
def away_from_repo(tmp_path):
  """A working directory holding a plain file named `gs:`: a tool that
  took `gs://B/x` for a local path would fail to write `./gs:/B/x`."""
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  (cwd / "gs:").write_text("a file, not a folder")
  yield str(cwd)
  assert sorted(os.listdir(cwd)) == ["gs:"]
  assert (cwd / "gs:").read_text() == "a file, not a folder"
  assert not os.path.exists(os.path.join(REPO, "gs:"))


def args_in(cwd, workdir, data_dir, **overrides):
  args = main_flags(workdir, data_dir, **overrides)
  return [f"--config={os.path.join(REPO, 'configs', 'digits.py')}",
          *args[1:]]


def stored(url):
  """The names of the objects under the gs:// folder `url`, relative to it
  (its folder placeholders left out)."""
  prefix = url.split("/", 3)[3] + "/"
  return sorted(name[len(prefix):] for name in gcs.list_objects(url)
                if name.startswith(prefix) and not name.endswith("/"))


def test_a_run_on_gcs_resumes_bitwise_and_every_tool_reads_it(
    gcs_bucket, digits_data_dir, tmp_path, away_from_repo):
  cwd = away_from_repo
  workdir = f"{gcs_bucket}/runs/digits"
  args = args_in(cwd, workdir, digits_data_dir, **RUN)
  run = start_main(args, cwd=cwd)
  wait_for_step(workdir, 3, run)
  run.send_signal(signal.SIGTERM)
  code, stdout, stderr = finish(run)
  assert code == 0, stderr[-3000:]
  stopped = int(re.search(r"stopped at step (\d+)", stdout).group(1))
  assert 3 <= stopped < RUN["total_steps"]
  assert f"checkpoint saved in {workdir};" in stdout
  assert max(r["step"] for r in metric_rows(workdir)) == stopped

  # The resume, in this process (the stop above is what needs one).
  stdout = run_tool("main", *args, cwd=cwd)
  assert f"tensorboard --logdir {workdir} --load_fast=false" in stdout
  config = small_config(digits_data_dir, **RUN)
  local = str(tmp_path / "local")
  run_training(config, local)
  step, params, _ = latest_checkpoint(workdir, config)
  assert step == RUN["total_steps"]
  _, expected, _ = latest_checkpoint(local, config)
  assert_trees_equal(params, expected)
  # Each step's row once, as an uninterrupted run writes them.
  assert sorted(logged(workdir)) == sorted(logged(local))
  assert logged(workdir, "test_accuracy") == logged(local, "test_accuracy")
  files = stored(workdir)
  for name in ("config.json", "metrics.jsonl", "time.json",
               f"checkpoints/{RUN['total_steps']}/_CHECKPOINT_METADATA"):
    assert name in files, files
  assert any(name.startswith("events.out.tfevents") for name in files)
  assert "lock.json" not in files  # Released.

  # (A finished run reported without a write: test_trusted_checkpoints.py.)

  # The tools take it: an export into the bucket holds the local run's
  # params.
  exported = f"{gcs_bucket}/exports/digits.npz"
  run_tool("export", f"--workdir={workdir}", f"--out={exported}", cwd=cwd)
  assert_trees_equal(npz.load_npz(exported), pretrained.load(local).params)

  images = tmp_path / "images"
  images.mkdir()
  rng = np.random.default_rng(0)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for i in range(3):
    pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    (images / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
  epath.Path(gcs_bucket, "images").mkdir(parents=True, exist_ok=True)
  for i in range(3):
    epath.Path(images / f"{i}.png").copy(
        epath.Path(f"{gcs_bucket}/images/{i}.png"))
  # The same images from the bucket and from the disk, in one call (the
  # run's params are the local run's, above).
  lines = run_tool("predict", f"--workdir={workdir}",
                   f"--images={gcs_bucket}/images,{images}", "--json",
                   cwd=cwd).splitlines()
  assert len(lines) == 6
  on_gcs, on_disk = "\n".join(lines[:3]), "\n".join(lines[3:])
  assert f"{gcs_bucket}/images/0.png" in on_gcs
  assert on_gcs.replace(f"{gcs_bucket}/images", str(images)) == on_disk

  run_tool("figures", f"--workdir={workdir}", "--num_images=4",
           "--rollout_images=2", "--split=test[:8]", cwd=cwd)
  figures = stored(f"{workdir}/figures")
  assert "training_curves.png" in figures and "attention_rollout.png" in (
      figures), figures

  # A fine-tune's init_from reads the run in the bucket (what it then
  # does with the params is init_from's, tested on local runs).
  assert_trees_equal(pretrained.load(workdir).params,
                     pretrained.load(local).params)


def test_a_pod_on_gcs_sets_a_damaged_checkpoint_aside(
    gcs_bucket, digits_data_dir):
  workdir = f"{gcs_bucket}/runs/pod"
  pod = {**RUN, "total_steps": 10, "optimizer.name": "sgd",
         "optimizer.weight_decay": 0.0,
         "evaluators.test.every": 0}
  # Its first 10 steps from this process, on the pod's 8 devices and mesh
  # (the pod below writes to the bucket as well).
  run_training(small_config(digits_data_dir, **pod), workdir)
  # The newest step's array files, cut in half.
  cut = 0
  for name in stored(f"{workdir}/checkpoints/10"):
    if "/d/" in f"/{name}":
      path = epath.Path(f"{workdir}/checkpoints/10/{name}")
      data = path.read_bytes()
      path.write_bytes(data[:len(data) // 2])
      cut += 1
  assert cut
  code, stdout, stderr = finish(start_pod(2, 4, main_flags(
      workdir, digits_data_dir, **{**pod, "total_steps": 12})))
  assert code == 0, stderr[-3000:]
  assert "Resuming at step 5 of 12" in stdout
  for process in (0, 1):
    assert any(line.startswith(f"[{process}]") and
               "checkpoint of step 10 does not read" in line
               for line in (stdout + stderr).splitlines()), stdout[-3000:]
  assert any(name.startswith("10.corrupt/")
             for name in stored(f"{workdir}/checkpoints"))
  assert max(logged(workdir)) == 12
  assert not os.path.exists(os.path.join(REPO, "gs:"))


RACERS = 4


def race(workdir):
  """What `_acquire` gave each of RACERS locks of runs on other hosts,
  started together on `workdir`: None for the lock it took, else the
  holder it found. The race is forced: every lock reads the workdir's
  lock before any writes one."""
  barrier = threading.Barrier(RACERS, timeout=60)
  read = lock.WorkdirLock._read  # pylint: disable=protected-access
  first_reads = set()

  def read_then_wait(self):
    holder = read(self)
    if id(self) not in first_reads:
      first_reads.add(id(self))
      barrier.wait()
    return holder
  # Refusing at once: runs on other hosts would otherwise wait for the
  # winner's lease (tests/test_trusted_checkpoints.py).
  locks = [lock.WorkdirLock(workdir, wait=False) for _ in range(RACERS)]
  for i, racer in enumerate(locks):
    racer._me["host"] = f"host-{i}"  # pylint: disable=protected-access
  results = [None] * RACERS
  errors_raised = []

  def take(i):
    try:
      results[i] = locks[i]._acquire()  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      errors_raised.append(e)
  threads = [threading.Thread(target=take, args=(i,))
             for i in range(RACERS)]
  with unittest.mock.patch.object(lock.WorkdirLock, "_read", read_then_wait):
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
  assert not errors_raised, errors_raised
  return locks, results


@pytest.mark.parametrize("left_before", [False, True])
def test_of_runs_starting_together_on_a_bucket_exactly_one_holds_it(
    gcs_bucket, left_before):
  """With no lock there, and with a stale one left by a run whose host is
  gone (renewed before the lease), which each takes over."""
  workdir = f"{gcs_bucket}/run"
  lock_url = f"{workdir}/{lock.LOCK_FILE}"
  for attempt in range(3):
    if left_before:
      epath.Path(lock_url).write_text(json.dumps({
          "host": "gone", "pid": 1, "since": 0,
          "renewed": time.time() - lock.LEASE_SECONDS - 1}))
    locks, results = race(workdir)
    winners = [i for i, result in enumerate(results) if result is None]
    assert len(winners) == 1, (attempt, results)
    holder = json.loads(epath.Path(lock_url).read_text())
    assert holder["host"] == f"host-{winners[0]}"
    assert all(result["host"] == holder["host"] for result in results
               if result is not None)
    # (A removal on the condition of another generation is not shown: the
    # emulator ignores preconditions on deletes.)
    locks[winners[0]]._remove()  # pylint: disable=protected-access
    assert not epath.Path(lock_url).exists()
