"""The self-distillation losses (vit_jax/training/dino_losses.py) against
Meta's DINOv2 loss modules and DINOv3's Gram loss, recorded on seeded
random arrays
(tests/fixtures/dinov2_losses/, benchmarks/record_dinov2_losses.py): equal
to 1e-5 relative."""

import os

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from vit_jax.training import dino_losses

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures",
                        "dinov2_losses")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def recorded():
  return (load_file(os.path.join(FIXTURES, "inputs.safetensors")),
          load_file(os.path.join(FIXTURES, "outputs.safetensors")))


def close(actual, expected):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected)
  scale = np.abs(expected).max()
  np.testing.assert_allclose(actual, expected, rtol=0,
                             atol=TOLERANCE * scale)


def f32(x):
  return jnp.asarray(x, jnp.float32)


@pytest.mark.parametrize("name,temperature",
                         [("student", 0.1), ("student_other", 0.2)])
def test_dino_loss(recorded, name, temperature):
  inputs, outputs = recorded
  student, teacher = (f32(inputs["dino/student_logits"]),
                      f32(inputs["dino/teacher_probs"]))
  close(dino_losses.dino_loss(student, teacher, temperature),
        outputs[f"dino/loss_{name}"])
  # Lists of crops, as Meta's module takes them.
  close(dino_losses.dino_loss(list(student), list(teacher), temperature),
        outputs[f"dino/loss_{name}"])


@pytest.mark.parametrize("name,temperature,iterations", [
    ("teacher", 0.07, 3), ("teacher_warm", 0.04, 3),
    ("one_iteration", 0.07, 1)])
def test_sinkhorn_knopp(recorded, name, temperature, iterations):
  inputs, outputs = recorded
  probs = dino_losses.sinkhorn_knopp(f32(inputs["sinkhorn/teacher_logits"]),
                                     temperature, iterations)
  close(probs, outputs[f"sinkhorn/probs_{name}"])
  np.testing.assert_allclose(np.asarray(probs).sum(axis=1), 1, atol=1e-5)


def test_sinkhorn_knopp_over_valid_rows_only(recorded):
  """iBOT's: padding rows change nothing and come out zero."""
  inputs, outputs = recorded
  logits = f32(inputs["sinkhorn/teacher_logits"])
  valid = jnp.arange(logits.shape[0]) < 9
  # Padding of large logits would dominate were it counted.
  padded = jnp.where(valid[:, None], logits, 5.0)
  probs = np.asarray(dino_losses.sinkhorn_knopp(padded, 0.07, valid=valid))
  close(probs[:9], outputs["sinkhorn/ibot_probs_first9"])
  assert (probs[9:] == 0).all()


def test_running_center(recorded):
  inputs, outputs = recorded
  first, second = (f32(inputs["center/first_logits"]),
                   f32(inputs["center/second_logits"]))
  center = jnp.zeros((first.shape[1],))
  close(dino_losses.softmax_centered(first, center, 0.07),
        outputs["center/first_probs"])
  center = dino_losses.updated_center(center, first.mean(axis=0))
  close(center, outputs["center/center_after_first"])
  close(dino_losses.softmax_centered(second, center, 0.07),
        outputs["center/second_probs"])


@pytest.mark.parametrize("name,temperature", [
    ("loss", 0.1), ("loss_masked", 0.1), ("loss_student_other", 0.2)])
def test_ibot_patch_loss(recorded, name, temperature):
  inputs, outputs = recorded
  close(dino_losses.ibot_patch_loss(f32(inputs["ibot/student_logits"]),
                                    f32(inputs["ibot/teacher_probs"]),
                                    inputs["ibot/masks"] > 0, temperature),
        outputs[f"ibot/{name}"])


@pytest.mark.parametrize("name,rows", [("loss", None), ("loss_first_half", 9)])
def test_koleo_loss(recorded, name, rows):
  inputs, outputs = recorded
  features = f32(inputs["koleo/features"][:rows])
  close(dino_losses.koleo_loss(features), outputs[f"koleo/{name}"])


@pytest.mark.parametrize("name,settings", [
    ("loss", dict(remove_negatives=True)),  # GramLoss's own default
    ("loss_keep_negatives", {}),  # DINOv3's configs, this function's
    ("loss_only_teacher_negatives", dict(remove_only_teacher_negatives=True)),
    ("loss_unnormalised", dict(normalize=False)),
    ("loss_batch_level", dict(image_level=False))])
def test_gram_loss(recorded, name, settings):
  """DINOv3's Gram anchoring (dinov3/loss/gram_loss.py) under each of its
  settings; patch features of 6 images, 7 patches each."""
  inputs, outputs = recorded
  close(dino_losses.gram_loss(f32(inputs["gram/student_features"]),
                              f32(inputs["gram/teacher_features"]),
                              **settings), outputs[f"gram/{name}"])


def test_gram_loss_takes_one_way_of_removing_negatives():
  x = jnp.ones((1, 2, 3))
  with pytest.raises(ValueError, match="not both"):
    dino_losses.gram_loss(x, x, remove_negatives=True,
                          remove_only_teacher_negatives=True)
