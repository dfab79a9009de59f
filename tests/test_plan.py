"""vit_jax.plan: a config's own train step, compiled for a TPU v3 slice by
libtpu on this CPU, and what it will cost."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs.table2 import pretrain
from tests.util import REPO
from vit_jax import compute, errors, models, planning

GiB = 2**30


def test_the_command_line_prints_one_json_object():
  command = [sys.executable, "-m", "vit_jax.plan",
             "--config=configs/digits.py", "--config.batch_size=64",
             "--config.mesh.data=4", "--config.mesh.model=2",
             "--num_classes=10", "--topology=v3-8", "--json"]
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  got = json.loads(done.stdout)
  assert got["config"] == "configs/digits.py"
  assert got["topology"] == "v3-8" and got["cores"] == 8
  assert got["mesh"] == {"data": 4, "fsdp": 1, "model": 2}
  assert got["batch_size"] == 64 and got["fits"] is True
  for key in ("hbm_bytes_per_core", "flops_per_core_per_step",
              "estimated_step_seconds", "mfu", "predicted_core_days",
              "compile_seconds"):
    assert got[key] > 0, key


def test_a_small_pretraining_config_on_v3_8():
  """Table 3's B/32 on JFT cut to one block at batch 256 (32 per core)."""
  config = pretrain.get_config("B/32,jft")
  with config.unlocked():
    config.model.num_layers = 1
  # Plain data parallelism: every core holds all of the state.
  config.update_from_flattened_dict({"batch_size": 256, "mesh.fsdp": 1,
                                     "model.scan_layers": False})
  got = planning.plan(config, "v3-8").to_json()

  assert got["topology"] == "v3-8" and got["cores"] == 8
  assert got["mesh"] == {"data": 8, "fsdp": 1, "model": 1}
  assert got["fits"] is True
  # Params and Adam's two moments, replicated: 12 bytes per param on every
  # core, and the batch. JFT's head: 18,291 classes.
  model = models.create("B/32", 18_291, num_layers=1, representation_size=768)
  params = sum(x.size for x in jax.tree.leaves(jax.eval_shape(
      lambda: model.init(jax.random.key(0), np.zeros((1, 224, 224, 3)),
                         train=False))))
  assert 12 * params < got["hbm_argument_bytes"] < 12 * params + 2**23
  assert got["hbm_argument_bytes"] + got["hbm_temp_bytes"] <= got[
      "hbm_bytes_per_core"] <= 16 * GiB == got["hbm_capacity_bytes"]
  model_flops = compute.flops_per_image(
      model, 224, train=True, num_classes=18_291) * 256 / 8
  assert got["model_flops_per_core_per_step"] == pytest.approx(model_flops)
  # The compiler counts the optimizer, norms and softmax too, but not the
  # images' gradient, which the analytic 3 x forward includes (8% here).
  assert 0.9 * model_flops < got["flops_per_core_per_step"] < 1.2 * model_flops
  assert 0 < got["estimated_step_seconds"] < 1
  assert got["mfu"] == pytest.approx(
      model_flops / got["estimated_step_seconds"] / 61.5e12)
  assert 0 < got["mfu"] < 1
  assert got["total_steps"] == 517_823  # 7 epochs of 303M at 4,096.
  assert got["predicted_core_days"] == pytest.approx(
      517_823 * got["estimated_step_seconds"] * 8 / 86_400 * 1.05)
  assert got["compile_seconds"] > 0 and got["suggestions"] == []


def tiny_pretraining(**overrides):
  """One Ti/16 block and a 10-class head: a step that compiles in seconds;
  the batch sets how much HBM it takes."""
  config = pretrain.get_config("B/16,jft")
  with config.unlocked():
    config.model.num_layers = 1
  config.update_from_flattened_dict({
      "model.name": "Ti/16", "model.representation_size": None,
      "model.scan_layers": False, "mesh.fsdp": 1, **overrides})
  return config


def test_a_config_that_does_not_fit_is_told_what_would_make_it_fit():
  # 16,384 images per core: the activations overflow 16 GiB.
  too_big = planning.plan(tiny_pretraining(batch_size=131_072), "v3-8",
                      classes=10)
  assert not too_big.fits and too_big.hbm_temp_bytes > 16 * GiB
  assert too_big.estimated_step_seconds is None and too_big.mfu is None
  suggested = "\n".join(too_big.suggestions)
  for fix in ("--config.mesh.fsdp=8", "--config.model.remat_policy=",
              "--config.accum_steps=2", "--config.model.scan_layers=True",
              "--topology=v3-32"):
    assert fix in suggested
  assert "DOES NOT FIT" in planning.describe("tiny", too_big)


def test_micro_batches_are_all_costed():
  # XLA would count the loop's body once: half the FLOPs of 2 micro-batches.
  accumulated = planning.plan(tiny_pretraining(batch_size=512, accum_steps=2,
                                           image_size=64),
                          "v3-8", classes=10)
  assert accumulated.fits and accumulated.suggestions == []
  assert accumulated.cost_compile_seconds > 0
  assert accumulated.flops_per_core_per_step == pytest.approx(
      accumulated.model_flops_per_core_per_step, rel=0.1)
  assert 0 < accumulated.mfu < 1


def test_slices_and_class_counts():
  devices, name = planning.topology("v3-32")
  assert name == "v3-32" and len(devices) == 32
  assert {d.device_kind for d in devices} == {"TPU v3"}
  assert planning.topology("v3:2x2")[1] == "v3-8"
  with pytest.raises(ValueError, match="no TPU v3-12 slice.*v3-8, v3-32"):
    planning.topology("v3-12")
  with pytest.raises(ValueError, match="such as v3-512"):
    planning.topology("v4-8")

  config = pretrain.get_config("L/16,i21k")
  assert planning.num_classes(config) == 21_843  # Not on this machine.
  assert planning.num_classes(config, 5) == 5
  config.dataset = "cifar100"  # In the TFDS catalog, not prepared here.
  assert planning.num_classes(config) == 100
  config.dataset = "vtab:dsprites_location"
  assert planning.num_classes(config) == 16
  config.dataset = "no_such_dataset"
  with pytest.raises(errors.ConfigError, match="--num_classes"):
    planning.num_classes(config)
