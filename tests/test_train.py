"""The training loop: sharding invariance, resumption, overrides, learning."""

import json
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests.util import (
  REPO,
  assert_trees_equal,
  latest_checkpoint,
  latest_state,
  metric_rows,
  program_of,
  run_training,
  small_config,
  train_steps,
)
from vit_jax import errors, runtime, sharding
from vit_jax.data import pipeline
from vit_jax.models import flops
from vit_jax.runs import settings
from vit_jax.training import throughput


def first_losses(config, devices, num_steps=3):
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  program = program_of(config, mesh=mesh)
  state = program.init(jax.random.key(config.seed))
  return train_steps(program, state, config, num_steps, augment=("shift",))


MESHES = {
    "1 device": (dict(data=1, fsdp=1, model=1), 1),
    "data 4 x model 2": (dict(data=4, fsdp=1, model=2), 8),
    "fsdp 8": (dict(data=1, fsdp=8, model=1), 8),
    "data 2 x fsdp 2 x model 2": (dict(data=2, fsdp=2, model=2), 8),
}


def test_losses_are_the_same_on_every_mesh(digits_data_dir):
  """With dropout on: its random bits do not depend on the sharding either.
  And `model.attention=splash` (Pallas's TPU kernel, interpreted here),
  which runs per device over the batch and head axes, follows the einsum
  on the mesh that splits both."""
  losses = {}
  for name, (mesh, num_devices) in MESHES.items():
    config = small_config(digits_data_dir, mesh=mesh)
    losses[name], _ = first_losses(config, jax.devices()[:num_devices])
  mesh, _ = MESHES["data 2 x fsdp 2 x model 2"]
  splash = small_config(digits_data_dir, mesh=mesh,
                        **{"model.attention": "splash"})
  losses["splash"], _ = first_losses(splash, jax.devices())
  reference = losses["1 device"]
  assert reference[-1] < reference[0]  # They train, and not trivially.
  for name, values in losses.items():
    np.testing.assert_allclose(values, reference, rtol=1e-5, err_msg=name)


def test_float8_losses_are_the_same_on_one_device_and_a_split_mesh(
    digits_data_dir):
  """model.fp8 scales each tensor by its absolute maximum over the whole
  tensor, not over one device's shard of it."""
  losses = {}
  for name in ("1 device", "data 2 x fsdp 2 x model 2"):
    mesh, num_devices = MESHES[name]
    config = small_config(digits_data_dir, mesh=mesh,
                          **{"model.fp8": True, "model.dtype": "bfloat16"})
    losses[name], _ = first_losses(config, jax.devices()[:num_devices])
  reference = losses["1 device"]
  assert reference[-1] < reference[0]
  np.testing.assert_allclose(losses["data 2 x fsdp 2 x model 2"], reference,
                             rtol=1e-3)


def test_params_and_moments_are_sharded_as_the_rules_say(digits_data_dir):
  config = small_config(digits_data_dir,
                        mesh=dict(data=2, fsdp=2, model=2))
  _, state = first_losses(config, jax.devices(), num_steps=1)
  block = state.params["Transformer"]["encoderblock_0"]
  query = block["MultiHeadDotProductAttention_1"]["query"]["kernel"]
  # (embed, heads, kv): heads over model; FSDP takes the largest free dim.
  assert query.sharding.spec == jax.P("fsdp", "model", None)
  assert query.addressable_shards[0].data.shape == (16, 2, 8)
  dense_0 = block["MlpBlock_3"]["Dense_0"]["kernel"]
  assert dense_0.sharding.spec == jax.P("fsdp", "model")
  assert dense_0.addressable_shards[0].data.shape == (16, 32)
  out = block["MultiHeadDotProductAttention_1"]["out"]["kernel"]
  assert out.sharding.spec == jax.P("model", None, "fsdp")
  # The optimizer's moments live exactly where their params do.
  adam = state.opt_state[1]  # After the clipping in the chain.
  mu = adam.mu["Transformer"]["encoderblock_0"]["MlpBlock_3"]["Dense_0"][
      "kernel"]
  assert mu.sharding.spec == dense_0.sharding.spec
  assert state.step.sharding.spec == jax.P()


def test_gradient_accumulation_matches_the_full_batch(digits_data_dir):
  # Without dropout: micro-batches draw their own dropout masks.
  no_dropout = {"model.dropout_rate": 0.0}
  whole, state_whole = first_losses(
      small_config(digits_data_dir, **no_dropout), jax.devices(), num_steps=2)
  accumulated, state_accumulated = first_losses(
      small_config(digits_data_dir, accum_steps=4, **no_dropout),
      jax.devices(), num_steps=2)
  np.testing.assert_allclose(accumulated, whole, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               state_accumulated.params, state_whole.params)


def test_fused_attention_trains_digits_as_the_einsum_does(digits_data_dir):
  """`model.attention=fused` (XLA's jax.nn.dot_product_attention here)
  follows the einsum's training curve, dropout and all, for 40 steps."""
  learning = {"total_steps": 40, "batch_size": 64, "model.hidden_size": 64,
              "model.mlp_dim": 128, "optimizer.warmup_steps": 10}
  einsum, _ = first_losses(
      small_config(digits_data_dir, **learning), jax.devices(), num_steps=40)
  fused, _ = first_losses(
      small_config(digits_data_dir, **learning, **{"model.attention": "fused"}),
      jax.devices(), num_steps=40)
  assert np.mean(einsum[-5:]) < 0.96 * einsum[0]
  # The losses; not every param: Adam scales the tiny gradients of some
  # biases up to steps of the learning rate's size, rounding and all.
  np.testing.assert_allclose(fused, einsum, rtol=1e-4)


def test_a_run_builds_its_model_and_optimizer_once(digits_data_dir, tmp_path,
                                                   monkeypatch):
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.training import optimizer  # pylint: disable=g-import-not-at-top
  built = []
  for module, name in ((models, "create_from_settings"),
                       (optimizer, "create")):
    real = getattr(module, name)

    def counted(*args, real=real, name=name, **kwargs):
      built.append(name)
      return real(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
  config = small_config(digits_data_dir, total_steps=2, log_every=1,
                        checkpoint_every=2, **{"evaluators.test.every": 2,
                                               "optimizer.warmup_steps": 1})
  assert "test_accuracy" in run_training(config, str(tmp_path / "run"))
  # The optimizer twice: for the state's structure, and inside the train
  # step, from the schedule's numbers as the step takes them (data).
  assert sorted(built) == ["create", "create", "create_from_settings"]


def test_a_crashed_run_resumes_to_the_uninterrupted_result(
    digits_data_dir, tmp_path, monkeypatch):
  config = small_config(digits_data_dir, log_every=1)
  run_training(config, str(tmp_path / "straight"))

  real_train_dataset = pipeline.train_dataset
  # The data runs out after 4 batches: the run dies during step 5, after
  # the checkpoint of step 3.
  monkeypatch.setattr(pipeline, "train_dataset",
                      lambda *a, **k: real_train_dataset(*a, **k).take(4))
  with pytest.raises(StopIteration):
    run_training(config, str(tmp_path / "resumed"))
  step, _, _ = latest_checkpoint(str(tmp_path / "resumed"), config)
  assert step == 3
  monkeypatch.setattr(pipeline, "train_dataset", real_train_dataset)
  run_training(config, str(tmp_path / "resumed"))

  straight, _ = latest_state(str(tmp_path / "straight"), config)
  resumed, progress = latest_state(str(tmp_path / "resumed"), config)
  assert int(straight.step) == int(resumed.step) == 6
  # Bitwise, as the README says: the params and the optimizer's state.
  assert_trees_equal(resumed.params, straight.params)
  assert_trees_equal(resumed.opt_state, straight.opt_state)
  assert progress["seconds"]["train"] > 0
  rows = metric_rows(tmp_path / "resumed")
  core_days = [r["core_days"] for r in rows if "core_days" in r]
  assert core_days == sorted(core_days)  # Cumulative across the restart.
  # The crashed run logged step 4 too; its row was dropped on resume.
  assert [r["step"] for r in rows if "train_loss" in r] == [1, 2, 3, 4, 5, 6]
  for name in {name for r in rows for name in r} - {"step"}:
    steps = [r["step"] for r in rows if name in r]
    assert len(steps) == len(set(steps)), name


def test_a_vit_learns_digits(digits_data_dir, tmp_path):
  config = small_config(
      digits_data_dir, total_steps=150, log_every=25,
      checkpoint_every=150, batch_size=64, **{"evaluators.test.every": 75,
          "optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 20,
          "model.hidden_size": 64, "model.mlp_dim": 128})
  start = time.time()
  result = run_training(config, str(tmp_path))
  wall_seconds = time.time() - start
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  losses = [r["train_loss"] for r in rows if "train_loss" in r]
  assert losses[-1] < 0.5 * losses[0]
  assert result["test_accuracy"] > 0.6  # Chance is 0.1.
  for key in ("train_loss", "learning_rate", "img_per_sec_per_device",
              "core_days", "test_accuracy", "flops_per_step",
              "tflops_per_sec_per_device", "mfu"):
    assert any(key in r for r in rows), key
  logged = rows[-1]
  assert logged["flops_per_step"] == 64 * flops.flops_per_image(
      settings.of(config).model, 8, train=True, num_classes=10)
  assert logged["tflops_per_sec_per_device"] == pytest.approx(
      logged["img_per_sec_per_device"] * logged["flops_per_step"] / 64 / 1e12)
  # Against the measured matmul rate of the CPUs the 8 devices share.
  assert 0 < logged["mfu"] < 1.5
  # MFU by its definition, from the numbers the run logged: a step's FLOPs
  # times the steps per second (its images per second over the batch, on
  # all 8 devices), over the 8 devices' peak. The peak is the matmul rate
  # this process measured once (throughput.py), which the run used.
  peak, source = throughput.peak_flops_per_device()
  assert source.startswith("measured")
  assert peak == throughput.measured_matmul_flops() / 8
  steps_per_sec = logged["img_per_sec_per_device"] * 8 / 64
  assert logged["mfu"] == pytest.approx(
      logged["flops_per_step"] * steps_per_sec / (8 * peak), rel=1e-9)
  # Its window's 25 steps took no longer than the whole run.
  assert logged["img_per_sec_per_device"] * 8 >= 25 * 64 / wall_seconds
  # Core-days: the run's wall time (its compiles, evaluations and saves
  # included) times the 8 devices, as saved for the next restart.
  _, _, progress = latest_checkpoint(str(tmp_path), config)
  assert result["core_days"] == pytest.approx(
      sum(progress["seconds"].values()) * 8 / 86_400, rel=0.02)
  assert 0.5 * wall_seconds < result["core_days"] * 86_400 / 8 < wall_seconds
  assert all(r["step"] > 0 for r in rows)


# What `python -m vit_jax.main` prints, line by line, and nothing else.
OUTPUT_LINES = [
    r"Preparing dataset digits in .* \(once\)",
    r"Training Ti/2 on digits for 4 steps: batch 16, 8 devices \(mesh "
    r"data=8 x fsdp=1 x model=1\), workdir .*",
    r"step 1/4 \| loss \d\.\d{4} \| first step \(compiles\) \d+s",
    r"step 2/4 \| loss \d\.\d{4} \| [\d,]+ img/s \| ETA \d+s",
    r"step 4/4 \| loss \d\.\d{4} \| [\d,]+ img/s \| ETA 0s",
    r"step 4/4 \| test_accuracy \d\.\d{4} \| test_examples 360",
    r"test_accuracy \d\.\d{4} \| test_examples 360 \| core_days \d\.\d+ "
    r"\(\w+ [\d,]+s \(\d+%\).*\) \| TensorBoard: "
    r"tensorboard --logdir .*",
]


def test_command_line_overrides_take_effect_and_only_progress_is_printed(
    tmp_path):
  workdir = tmp_path / "run"
  command = [
      sys.executable, "-m", "vit_jax.main", "--config=configs/digits.py",
      f"--workdir={workdir}", f"--config.data_dir={tmp_path / 'data'}",
      "--config.total_steps=4", "--config.batch_size=16",
      "--config.log_every=2", "--config.evaluators.test.every=4",
      "--config.checkpoint_every=4", "--config.model.hidden_size=16",
      "--config.model.num_layers=1", "--config.mesh.data=8",
      "--config.mesh.model=1", "--config.optimizer.warmup_steps=1"]
  # As a user runs it: no setting that quietens a library from outside.
  env = {name: value for name, value in os.environ.items()
         if name not in ("TF_CPP_MIN_LOG_LEVEL", *runtime.AHEAD_OF_TIME)}
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                        timeout=300, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stderr == ""
  lines = done.stdout.splitlines()
  assert len(lines) == len(OUTPUT_LINES), done.stdout
  for line, pattern in zip(lines, OUTPUT_LINES):
    assert re.fullmatch(pattern, line), (line, pattern)
  saved = json.load(open(workdir / "config.json"))
  assert saved["total_steps"] == 4 and saved["batch_size"] == 16
  assert saved["model"]["hidden_size"] == 16 and saved["mesh"]["data"] == 8
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  assert max(r["step"] for r in rows) == 4
  assert os.listdir(workdir / "checkpoints") == ["4"]
  # A line at a step that logs shows metrics.jsonl's train_loss there (the
  # mean of the steps since the last row), not the step's own loss.
  logged = {r["step"]: r["train_loss"] for r in rows if "train_loss" in r}
  printed = dict(re.findall(r"^step (\d)/4 \| loss (\S+) ", done.stdout,
                            re.MULTILINE))
  assert sorted(logged) == [2, 4]
  assert {step: printed[str(step)] for step in logged} == {
      step: f"{loss:.4f}" for step, loss in logged.items()}


def compiles_during(fn):
  """How many XLA compilations `fn` triggered, and the error it raised."""
  events = []
  listener = lambda event, *_, **__: events.append(event)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    with pytest.raises(errors.InputError) as error:
      fn()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  return [e for e in events if "backend_compile" in e], str(error.value)


@pytest.mark.parametrize("overrides,message", [
    (dict(batch_size=30), "batch_size=30 is not divisible by the 4 "
     "data-parallel devices"),
    (dict(mesh=dict(data=3, fsdp=1, model=1)), "needs 3 devices, but there "
     "are 8"),
    (dict(mesh=dict(data=-1, fsdp=3, model=1)), "not divisible by 3"),
    (dict(image_size=9), "patch size 2 does not divide config.image_size=9"),
    (dict(dataset="no_such_dataset"), "no_such_dataset"),
    (dict(**{"model.num_heads": 3, "model.hidden_size": 48}),
     "not divisible by the mesh axis 'model'"),
    (dict(image_size=0), "config.image_size must be a whole number >= 1"),
    (dict(keep_checkpoints=0), "config.keep_checkpoints must be a whole"),
    (dict(eval_crop_fraction=1.5), "config.eval_crop_fraction: must be in"),
    (dict(**{"optimizer.b2": 1.0}), "config.optimizer.b2 must be a number in "
     "[0.0, 1.0)"),
    (dict(**{"model.mlp_dim": 0}), "config.model.mlp_dim must be a whole "
     "number >= 1, got 0"),
    (dict(**{"model.dtype": "float8"}), "config.model: dtype must be a float"),
    (dict(**{"model.layer_norm_epsilon": -1.0}),
     "config.model: layer_norm_epsilon must be > 0"),
    (dict(profile_steps="3"), "config.profile_steps must be 'START,COUNT'"),
    (dict(profile_steps="0,2"), "config.profile_steps must be 'START,COUNT'"),
    (dict(**{"optimizer.mu_dtype": "fp8"}), "config.optimizer.mu_dtype must "
     "be one of float32, bfloat16"),
])
def test_bad_configs_fail_clearly_before_compiling(digits_data_dir, tmp_path,
                                                   overrides, message):
  config = small_config(digits_data_dir, **overrides)
  compiles, error = compiles_during(
      lambda: run_training(config, str(tmp_path)))
  assert message in error
  assert not compiles
