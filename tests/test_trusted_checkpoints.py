"""Checkpoints a run can trust: a damaged one is found, named and set aside,
and the run resumes from the one before; one workdir has one writer; a
finished run is reported without writing to its workdir."""

import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

from tests.util import (
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
  stored_examples,
  wait_for_step,
)
from vit_jax import errors
from vit_jax.data import sources
from vit_jax.runs import fingerprints, lock
from vit_jax.weights import npz, pretrained

# Checkpoints at 4, 6 and 8 are kept (the 100/150/200, in small).
SAVED = {"total_steps": 8, "checkpoint_every": 2, "keep_checkpoints": 3,
         "log_every": 2, "evaluators.test.every": 8}
LONGER = {**SAVED, "total_steps": 10}


@pytest.fixture(scope="module")
def saved_run(digits_data_dir, tmp_path_factory):
  """A run with checkpoints at 4, 6 and 8, and the params of the same run
  extended to step 10 from its checkpoint of step 6."""
  def make(path):
    run_training(small_config(digits_data_dir, **SAVED), f"{path}/run")
    shutil.copytree(f"{path}/run", f"{path}/from6")
    shutil.rmtree(f"{path}/from6/checkpoints/8")
    run_training(small_config(digits_data_dir, **LONGER), f"{path}/from6")
  path = made_once(tmp_path_factory, "saved_run", make)
  config = small_config(digits_data_dir, **LONGER)
  return f"{path}/run", latest_checkpoint(f"{path}/from6", config)[1], config


def largest_data_file(step_dir):
  files = [os.path.join(root, name) for root, _, names in os.walk(step_dir)
           for name in names if os.sep + "d" + os.sep in
           os.path.join(root, name) + os.sep]
  return max(files, key=os.path.getsize)


def truncate(step_dir):
  path = largest_data_file(step_dir)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def random_bytes(step_dir):
  path = largest_data_file(step_dir)
  size = os.path.getsize(path)
  with open(path, "wb") as f:
    f.write(np.random.default_rng(0).bytes(size))


def flip_bytes(step_dir):
  path = largest_data_file(step_dir)
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    f.seek(0)
    f.write(data)


def no_commit_markers(step_dir):
  for root, _, names in os.walk(step_dir):
    for name in names:
      if name in ("_CHECKPOINT_METADATA", "commit_success.txt", "_METADATA"):
        os.remove(os.path.join(root, name))


def altered_array(step_dir):
  """An array that reads but is not what was saved: its fingerprint in the
  saved progress no longer matches (as bytes changed under a format that
  still decodes would)."""
  path = os.path.join(step_dir, "progress", "metadata")
  with open(path) as f:
    progress = json.load(f)
  name = sorted(progress["fingerprints"])[0]
  progress["fingerprints"][name][1] ^= 1
  with open(path, "w") as f:
    json.dump(progress, f)


@pytest.mark.parametrize("damage", [truncate, random_bytes, flip_bytes,
                                    no_commit_markers, altered_array])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes(
    saved_run, tmp_path, caplog, damage):
  original, expected, config = saved_run
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  damage(os.path.join(workdir, "checkpoints", "8"))
  with caplog.at_level(logging.WARNING):
    run_training(config, workdir)
  warnings = [r.getMessage() for r in caplog.records
              if "checkpoint of step" in r.getMessage()]
  assert len(warnings) == 1 and "step 8" in warnings[0], warnings
  # What is wrong, in a line: not orbax's wrapper (a method's repr and a
  # page of tensorstore spec).
  assert "bound method" not in warnings[0] and len(warnings[0]) < 600, (
      warnings)
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "8.corrupt"))
  step, params, _ = latest_checkpoint(workdir, config)
  assert step == 10
  assert_trees_equal(params, expected)


def test_with_every_checkpoint_damaged_the_run_stops_naming_each(
    saved_run, tmp_path):
  original, _, config = saved_run
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  for step in (4, 6, 8):
    truncate(os.path.join(workdir, "checkpoints", str(step)))
  with pytest.raises(errors.RunError) as error:
    run_training(config, workdir)
  message = str(error.value)
  assert all(f"step {step} does not read" in message for step in (4, 6, 8))
  assert len(message.splitlines()) == 1


def test_fingerprints_do_not_depend_on_sharding_and_see_one_bit():
  import jax  # pylint: disable=g-import-not-at-top
  x = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 7
  tree = {"a": x, "b": np.arange(5, dtype=np.int32)}
  mesh = jax.make_mesh((8,), ("data",))
  sharded = {"a": jax.device_put(x, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("data"))), "b": tree["b"]}
  expected = fingerprints.of(tree)
  assert fingerprints.of(sharded) == expected
  flipped = x.copy()
  flipped.view(np.uint32)[3, 5] ^= 1
  assert fingerprints.mismatches(expected, {**tree, "a": flipped}) == ["['a']"]
  swapped = x.copy()
  swapped[[0, 1]] = swapped[[1, 0]]  # Same words, other places.
  assert fingerprints.mismatches(expected, {**tree, "a": swapped}) == ["['a']"]


def snapshot(workdir):
  return {os.path.relpath(os.path.join(root, name), workdir):
          os.stat(os.path.join(root, name)).st_mtime_ns
          for root, _, names in os.walk(workdir) for name in names}


def test_a_held_workdir_refuses_a_second_run_and_is_left_as_it_was(
    saved_run, tmp_path):
  original, _, config = saved_run
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  other_run = subprocess.Popen(["sleep", "300"])  # Alive, on this host.
  try:
    holder = {"host": socket.gethostname(), "pid": other_run.pid,
              "since": time.time(), "renewed": time.time()}
    with open(os.path.join(workdir, lock.LOCK_FILE), "w") as f:
      json.dump(holder, f)
    before = snapshot(workdir)
    with pytest.raises(errors.RunError, match=f"in use by process "
                       f"{other_run.pid} on host {socket.gethostname()}"):
      run_training(config, workdir)
    assert snapshot(workdir) == before
  finally:
    other_run.kill()
    other_run.wait()


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_lock_appears_whole_and_only_once(tmp_path, monkeypatch,
                                            hard_links):
  if not hard_links:  # A FUSE mount of a bucket, say.
    def no_link(*_):
      raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "link", no_link)
  path = tmp_path / lock.LOCK_FILE
  with lock.WorkdirLock(str(tmp_path)):
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert os.listdir(tmp_path) == [lock.LOCK_FILE]  # No temporary left.
    # Another run's exclusive creation fails (from this process, a run
    # would take the lock over as one left by a dead process of its pid).
    second = lock.WorkdirLock(str(tmp_path))
    assert second._create(replace=False) is False  # pylint: disable=protected-access
    assert json.loads(path.read_text())["pid"] == os.getpid()
  assert os.listdir(tmp_path) == []


def test_a_signal_as_the_lock_appears_removes_it(tmp_path, monkeypatch):
  link = os.link

  def link_then_stopped(*args):
    link(*args)
    raise KeyboardInterrupt  # What cli.signals.Stopped is.
  monkeypatch.setattr(os, "link", link_then_stopped)
  with pytest.raises(KeyboardInterrupt):
    with lock.WorkdirLock(str(tmp_path)):
      pass
  assert os.listdir(tmp_path) == []


# A lock left by kill -9 is taken over: tests/test_goodput.py, whose
# kill -9 run leaves one.


@pytest.mark.parametrize("holder_alive", [False, True])
def test_another_hosts_lock_is_waited_out_and_taken_unless_renewed(
    tmp_path, monkeypatch, capfd, holder_alive):
  """A pod restarted on other hosts after a hard preemption finds its dead
  predecessor's lock, renewed less than a lease ago: it waits for the
  lease, saying so once, rather than refusing (under GKE's
  --max-restarts each refusal burned a restart); a holder that renews it
  meanwhile is alive, and the run is refused."""
  monkeypatch.setattr(lock, "LEASE_SECONDS", 1)
  path = tmp_path / lock.LOCK_FILE

  def write_lock():
    path.write_text(json.dumps({"host": "elsewhere", "pid": 7, "since": 1,
                                "renewed": time.time()}))
  write_lock()
  sleep = time.sleep
  slept = []

  def sleep_and_maybe_renew(seconds):
    slept.append(seconds)
    sleep(seconds)
    if holder_alive:
      write_lock()
  monkeypatch.setattr(lock.time, "sleep", sleep_and_maybe_renew)
  got = lock.WorkdirLock(str(tmp_path))._acquire()  # pylint: disable=protected-access
  assert len(slept) == 1 and 0 < slept[0] <= 2
  said = capfd.readouterr().err
  assert said.count("\n") == 1
  assert said.startswith(f"{tmp_path} is held by process 7 on host "
                         "elsewhere, whose lease lapses at ")
  if holder_alive:
    assert got["host"] == "elsewhere"
  else:
    assert got is None
    assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_second_run_started_later_loses_no_save_and_no_row(
    digits_data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  args = main_flags(workdir, digits_data_dir, **{
      **LONGER, "total_steps": 40, "checkpoint_every": 1,
      "keep_checkpoints": 40, "log_every": 1})
  # The first run in a process of its own: the lock holds one writer per
  # process, and this process would take over a lock of its own pid as
  # one left by a dead run. The second, refused, runs here.
  first = start_main(args)
  wait_for_step(workdir, 20, first)
  code, _, stderr = call_tool("main", *args)
  assert code == 2 and "is in use by process" in stderr, stderr[-3000:]
  code, _, stderr = finish(first)
  assert code == 0, stderr[-3000:]
  steps = [r["step"] for r in metric_rows(workdir) if "train_loss" in r]
  assert steps == list(range(1, 41))
  saved = sorted(int(name) for name in os.listdir(f"{workdir}/checkpoints")
                 if name.isdigit())
  assert saved == list(range(1, 41))


def test_a_finished_run_whose_last_checkpoint_is_damaged_trains_it_again(
    saved_run, digits_data_dir, tmp_path):
  original, _, _ = saved_run
  config = small_config(digits_data_dir, **SAVED)
  expected = latest_checkpoint(original, config)[1]
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  truncate(os.path.join(workdir, "checkpoints", "8"))
  run_training(config, workdir)
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "8.corrupt"))
  step, params, _ = latest_checkpoint(workdir, config)
  assert step == 8
  assert_trees_equal(params, expected)


def test_a_finished_run_is_reported_without_writing_to_its_workdir(
    saved_run, digits_data_dir, tmp_path):
  original, _, _ = saved_run
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  before = snapshot(workdir)
  result = run_training(small_config(digits_data_dir, **SAVED), workdir)
  assert "test_accuracy" in result and result["core_days"] > 0
  assert snapshot(workdir) == before


def test_a_loss_that_turns_nan_soon_after_a_restore_does_not_blame_a_sane_one(
    saved_run, tmp_path, monkeypatch):
  # The checkpoint passed its fingerprint check and holds sane numbers:
  # the steps since are what diverged, and the advice starts from it.
  original, _, config = saved_run
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "8"))
  poison_step(monkeypatch, 8)
  with pytest.raises(errors.RunError) as stopped:
    run_training(config, workdir)
  message = str(stopped.value)
  assert message.startswith(
      "train_loss is nan at step 8: stopped before saving any state of that "
      "step. The checkpoint of step 6 that it resumed from is sane "
      "(params up to "), message
  assert "the 2 steps since diverged" in message
  assert f"--config.init_from={workdir}:6 and " in message
  assert "suspect" not in message and "move" not in message


def every_data_file_flipped(step_dir):
  """8 bytes flipped in the middle of each array file of the step: the
  params' among them, whichever files hold them."""
  for root, _, names in os.walk(step_dir):
    for name in names:
      if os.sep + "d" + os.sep in os.path.join(root, name) + os.sep:
        path = os.path.join(root, name)
        with open(path, "r+b") as f:
          data = bytearray(f.read())
          middle = len(data) // 2
          data[middle:middle + 8] = bytes(b ^ 0xFF
                                          for b in data[middle:middle + 8])
          f.seek(0)
          f.write(data)


def tool(name, *args):
  """(stdout, stderr) of `python -m vit_jax.NAME ARGS` (in this process),
  which must succeed."""
  code, stdout, stderr = call_tool(name, *args)
  assert code == 0, stderr[-3000:]
  return stdout, stderr


def test_read_only_tools_name_a_damaged_step_and_read_the_one_before(
    saved_run, digits_data_dir, tmp_path, caplog):
  original, _, _ = saved_run
  damaged, whole = str(tmp_path / "damaged"), str(tmp_path / "whole")
  shutil.copytree(original, damaged)
  every_data_file_flipped(os.path.join(damaged, "checkpoints", "8"))
  shutil.copytree(original, whole, ignore=lambda d, names: (
      ["8"] if d.endswith("checkpoints") else []))
  # An image of the digits' test split, from the prepared dataset.
  builder = sources.get_builder("digits", digits_data_dir)
  image = tmp_path / "digit.png"
  image.write_bytes(stored_examples(builder, "test")[0]["image"])

  outputs = {}
  for name, workdir in (("damaged", damaged), ("whole", whole)):
    _, said = tool("export", f"--workdir={workdir}",
                   f"--out={tmp_path / name}.npz")
    predicted, _ = tool("predict", f"--workdir={workdir}", f"--images={image}")
    outputs[name] = (npz.load_npz(f"{tmp_path / name}.npz"), predicted, said)
  assert "checkpoint of step 8" in outputs["damaged"][2]
  assert "checkpoint of step" not in outputs["whole"][2]
  assert_trees_equal(outputs["damaged"][0], outputs["whole"][0])
  assert outputs["damaged"][1] == outputs["whole"][1]
  assert sorted(os.listdir(os.path.join(damaged, "checkpoints"))) == [
      "4", "6", "8"]  # Read-only: nothing set aside.

  # init_from (and figures, which reads its model the same way).
  with caplog.at_level(logging.WARNING):
    loaded = pretrained.load(damaged)
  assert "step 6" in loaded.what
  assert any("checkpoint of step 8" in r.getMessage() for r in caplog.records)
  assert_trees_equal(loaded.params, pretrained.load(whole).params)
  with pytest.raises(errors.InputError, match="step 8 "):
    pretrained.load(f"{damaged}:8")


def test_a_checkpoint_of_another_model_is_a_config_error_not_corruption(
    saved_run, digits_data_dir, tmp_path):
  original, _, _ = saved_run
  workdir = str(tmp_path / "run")
  shutil.copytree(original, workdir)
  os.remove(os.path.join(workdir, "config.json"))  # Nothing to compare to.
  wider = small_config(digits_data_dir, **{**LONGER, "model.hidden_size": 48})
  with pytest.raises(errors.ConfigError, match="hold another model") as e:
    run_training(wider, workdir)
  assert "params/Transformer/" in str(e.value)
  assert "saved (32,), config (48,)" in str(e.value)
  # Another optimizer: the same params, other moments.
  sgd = small_config(digits_data_dir, **{**LONGER, "optimizer.name": "sgd",
                                         "optimizer.weight_decay": 0.0})
  with pytest.raises(errors.ConfigError, match="hold another model or "
                     "optimizer") as e:
    run_training(sgd, workdir)
  assert "opt_state/1/mu/" in str(e.value) and "config absent" in str(
      e.value), str(e.value)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [
      "4", "6", "8"]  # None set aside as *.corrupt.
