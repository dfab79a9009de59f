"""A run whose workdir is on Cloud Storage (the local one of tests/gcs.py)
trains, stops, resumes and is read by every tool as a local one is; nothing
of it lands on the local disk under a folder named `gs:`."""

import json
import os
import re
import shutil
import signal
import threading
import time
import unittest.mock

import jax
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
from vit_jax import errors
from vit_jax.runs import lock
from vit_jax.runs.workdir import Workdir
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

  # A branch in the bucket (vit_jax.branch: a WSD decay's new workdir)
  # holds the step's whole checkpoint and the metrics up to it.
  branched = f"{gcs_bucket}/runs/branched"
  run_tool("branch", f"--workdir={workdir}", f"--step={step}",
           f"--to={branched}", cwd=cwd)
  assert_trees_equal(latest_checkpoint(branched, config)[1], expected)
  assert logged(branched) == logged(workdir)


# A masked autoencoder (config.objective "mae"): each image's mask is drawn
# from its row of the global batch, whichever process reads it.
MAE = {"objective": "mae", "model.posemb": "sincos2d",
       "mae.decoder_hidden_size": 32, "mae.decoder_num_layers": 1,
       "mae.decoder_num_heads": 4, "mae.decoder_mlp_dim": 64}


@pytest.mark.processes(2)  # A pod of two.
def test_a_pod_on_gcs_sets_a_damaged_checkpoint_aside(
    gcs_bucket, digits_data_dir, tmp_path):
  """Both processes set it aside alike and resume from the step before;
  the pod, a masked autoencoder's, then trains as one process does from
  the same checkpoint."""
  workdir = f"{gcs_bucket}/runs/pod"
  pod = {**RUN, **MAE, "total_steps": 10, "optimizer.name": "sgd",
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
  # The same in this process: 10 steps, the 10th's checkpoint gone, resumed
  # at step 5 to step 12.
  local = str(tmp_path / "single")
  run_training(small_config(digits_data_dir, **pod), local)
  shutil.rmtree(os.path.join(local, "checkpoints", "10"))
  config = small_config(digits_data_dir, **{**pod, "total_steps": 12})
  run_training(config, local)
  single, resumed = logged(local), logged(workdir)
  steps = range(6, 13)
  # Gloo sums the two processes' gradients in another order: float32
  # rounding, as in tests/test_pod.py.
  np.testing.assert_allclose([resumed[s] for s in steps],
                             [single[s] for s in steps], rtol=1e-6)
  assert single[12] < single[1]
  _, pod_params, _ = latest_checkpoint(workdir, config)
  _, single_params, _ = latest_checkpoint(local, config)
  np.testing.assert_allclose(
      np.concatenate([x.ravel() for x in jax.tree.leaves(pod_params)]),
      np.concatenate([x.ravel() for x in jax.tree.leaves(single_params)]),
      rtol=1e-6, atol=5e-7)


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
    # (A removal on the condition of another generation:
    # test_a_removal_spares_a_lock_another_host_wrote_since.)
    locks[winners[0]]._remove()  # pylint: disable=protected-access
    assert not epath.Path(lock_url).exists()


def other_hosts_lock(url, renewed=None):
  """Writes, over whatever is there, the lock of a run on another host
  renewed at `renewed` (default now): a rival taking the workdir over."""
  epath.Path(url).write_text(json.dumps({
      "host": "rival", "pid": 7, "since": 1,
      "renewed": time.time() if renewed is None else renewed}))


def holder(url):
  """The host of the lock at `url`, read in one request (TensorFlow's
  client reads an object's size, then its bytes: a renewal between them
  would mix two versions)."""
  text, _ = lock._BucketObject(url).read()  # pylint: disable=protected-access
  return json.loads(text)["host"]


def test_a_renewal_after_a_rivals_write_fails_and_leaves_the_rivals_lock(
    gcs_bucket, monkeypatch):
  """Renewals are conditioned on the generation the holder wrote: once
  another host has written the lock (it took over a lease it saw lapse),
  the holder's next renewal is refused, it renews no more, and at its end
  it leaves the rival's lock in place."""
  monkeypatch.setattr(lock, "RENEW_SECONDS", 0.05)
  workdir = f"{gcs_bucket}/run"
  url = f"{workdir}/{lock.LOCK_FILE}"
  held = lock.WorkdirLock(workdir)
  renewals = []  # (generation asked, generation written or None)
  write = held._object.write  # pylint: disable=protected-access

  def recorded(text, generation):
    written = write(text, generation)
    renewals.append((generation, written))
    return written
  monkeypatch.setattr(held._object, "write", recorded)  # pylint: disable=protected-access
  with held:
    deadline = time.monotonic() + 60
    while len(renewals) < 3:  # Taken, then renewed.
      assert time.monotonic() < deadline
      time.sleep(0.01)
    # Each renewal on the condition of the generation written before it.
    assert all(written for _, written in renewals[:3])
    assert [asked for asked, _ in renewals[1:3]] == [
        written for _, written in renewals[:2]]
    assert holder(url) == held._me["host"]  # pylint: disable=protected-access
    other_hosts_lock(url)
    # Its next renewal is refused, and the renewer stops; the rival's lock
    # is never overwritten meanwhile.
    renewer = held._renewer  # pylint: disable=protected-access
    while renewer.is_alive():
      assert holder(url) == "rival"
      assert time.monotonic() < deadline
      renewer.join(timeout=0.05)
    assert renewals[-1][1] is None
    assert holder(url) == "rival"
  assert holder(url) == "rival"  # Not removed at the end either.


def test_a_removal_spares_a_lock_another_host_wrote_since(gcs_bucket,
                                                          monkeypatch):
  """The holder's removal is conditioned on the generation it wrote: a
  rival's lock written between the holder's last look and its delete
  stays. fake-gcs-server ignores preconditions on deletes, so they are
  checked here as Cloud Storage checks them."""
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  from google.cloud.storage import blob as blob_lib  # pylint: disable=g-import-not-at-top
  real_delete = blob_lib.Blob.delete
  conditions = []

  def delete(self, *args, if_generation_match=None, **kwargs):
    conditions.append(if_generation_match)
    if if_generation_match is not None:
      now = self.bucket.get_blob(self.name)
      if now is not None and now.generation != if_generation_match:
        raise exceptions.PreconditionFailed(
            f"generation {now.generation}, not {if_generation_match}")
    return real_delete(self, *args, if_generation_match=if_generation_match,
                       **kwargs)
  monkeypatch.setattr(blob_lib.Blob, "delete", delete)
  workdir = f"{gcs_bucket}/run"
  url = f"{workdir}/{lock.LOCK_FILE}"
  held = lock.WorkdirLock(workdir)
  real_held_by_me = held._held_by_me  # pylint: disable=protected-access
  looks = []

  def held_by_me_then_a_rival_writes():
    looks.append(real_held_by_me())
    other_hosts_lock(url)  # After the holder's last look.
    return looks[-1]
  monkeypatch.setattr(held, "_held_by_me", held_by_me_then_a_rival_writes)
  with held:
    pass
  assert looks == [True]
  assert epath.Path(url).exists() and holder(url) == "rival"
  assert conditions == [held._written]  # pylint: disable=protected-access
  # Without a rival, the removal takes the holder's own lock.
  conditions.clear()
  with lock.WorkdirLock(f"{gcs_bucket}/other") as own:
    pass
  assert conditions == [own._written]  # pylint: disable=protected-access
  assert not epath.Path(f"{gcs_bucket}/other/{lock.LOCK_FILE}").exists()


class LockClock:
  """The lock module's `time`: a clock that a sleep moves on at once, as
  far as it was asked to (no test waits out a lease)."""

  def __init__(self):
    self.slept = []

  def time(self):
    return time.time() + sum(self.slept)

  def sleep(self, seconds):
    self.slept.append(seconds)

  def ctime(self, seconds):
    return time.ctime(seconds)


@pytest.mark.parametrize("wait_for_lock,holder_alive", [
    (False, True), (True, True), (True, False)])
def test_another_hosts_lock_in_a_bucket_is_waited_out_as_configured(
    gcs_bucket, digits_data_dir, monkeypatch, capfd, wait_for_lock,
    holder_alive):
  """A run on a workdir in a bucket whose lock another host renewed less
  than a lease ago: with wait_for_lock it waits for the lease once, saying
  so, then takes the lock, or is refused if the holder renewed it
  meanwhile; without, it is refused at once. A refusal comes before
  anything is written."""
  workdir = f"{gcs_bucket}/run"
  url = f"{workdir}/{lock.LOCK_FILE}"
  clock = LockClock()
  real_sleep = clock.sleep

  def sleep_and_maybe_renew(seconds):
    real_sleep(seconds)
    if holder_alive:
      other_hosts_lock(url, clock.time())
  clock.sleep = sleep_and_maybe_renew
  monkeypatch.setattr(lock, "time", clock)
  other_hosts_lock(url)
  if holder_alive:  # Refused: the whole run, through its config key.
    config = small_config(digits_data_dir, wait_for_lock=wait_for_lock)
    with pytest.raises(errors.RunError, match="in use by process 7 on host "
                       "rival"):
      run_training(config, workdir)
    assert stored(workdir) == [lock.LOCK_FILE]
    assert holder(url) == "rival"
  else:  # Taken: what the run would hold, without its training.
    with Workdir(workdir).lock(wait_for_lock) as held:
      assert holder(url) == held._me["host"]  # pylint: disable=protected-access
    assert not epath.Path(url).exists()
  said = capfd.readouterr().err
  if wait_for_lock:
    assert len(clock.slept) == 1, clock.slept
    # Until the lease the holder's lock showed lapses (less the time the
    # run took to get to it).
    assert 0 < clock.slept[0] <= lock.LEASE_SECONDS + 1
    assert said.count(" is held by process 7 on host rival, whose lease "
                      "lapses at ") == 1, said
  else:
    assert not clock.slept and "whose lease lapses" not in said
