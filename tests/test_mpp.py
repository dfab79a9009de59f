"""Masked patch prediction: targets, corruption, pre-training, fine-tuning."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import mpp as mpp_config
from tests.util import (
  SMALL,
  latest_checkpoint,
  program_of,
  run_training,
  small_config,
)
from vit_jax import errors, models, sharding
from vit_jax.models import masked_patches, naflex
from vit_jax.runs import settings, writers
from vit_jax.training import resolve, step


def test_a_patch_of_one_colour_gives_its_3_bit_class():
  colours = [(255, 0, 0), (0, 0, 0), (128, 128, 128), (36, 73, 255)]
  # 3 bits: floor(value / 255 * 8), 7 at most; red * 64 + green * 8 + blue.
  expected = [7 * 64, 0, 4 * 64 + 4 * 8 + 4, 1 * 64 + 2 * 8 + 7]
  image = np.zeros((1, 4, 4, 3), np.uint8)
  for i, colour in enumerate(colours):  # 2x2 patches, row-major.
    image[0, 2 * (i // 2):2 * (i // 2) + 2, 2 * (i % 2):2 * (i % 2) + 2] = (
        colour)
  np.testing.assert_array_equal(masked_patches.targets(jnp.asarray(image), 2),
                                [expected])
  # The same image in [-1, 1], as the model also takes it.
  scaled = image.astype(np.float32) / 127.5 - 1
  np.testing.assert_array_equal(masked_patches.targets(jnp.asarray(scaled), 2),
                                [expected])
  # A patch half black, half white has the mean 0.5: level 4 of 8.
  halves = np.zeros((1, 2, 2, 3), np.uint8)
  halves[0, 0] = 255
  np.testing.assert_array_equal(masked_patches.targets(jnp.asarray(halves), 2),
                                [[4 * 64 + 4 * 8 + 4]])


def test_corruption_fractions_hold_within_sampling_error():
  images, patches = 4000, 196
  corruption = jax.device_get(
      masked_patches.corrupt(jax.random.key(0), images, patches))
  corrupted, masked = corruption.corrupted, corruption.masked
  own = np.arange(patches)
  replaced = corruption.source != own
  np.testing.assert_array_equal(corrupted.sum(axis=1), patches // 2)
  assert not (masked & ~corrupted).any() and not (replaced & ~corrupted).any()
  assert not (masked & replaced).any()
  total = corrupted.sum()
  for fraction, expected in ((masked.sum() / total, 0.8),
                             (replaced.sum() / total, 0.1),
                             ((corrupted & ~masked & ~replaced).sum() / total,
                              0.1)):
    sigma = np.sqrt(expected * (1 - expected) / total)
    assert abs(fraction - expected) < 4 * sigma
  # Which patches are corrupted is uniform over positions.
  per_position = corrupted.mean(axis=0)
  assert np.abs(per_position - 0.5).max() < 4 * np.sqrt(0.25 / images)


def test_the_corruption_puts_the_mask_in_and_moves_embeddings():
  embeddings = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
  corruption = masked_patches.Corruption(
      source=jnp.array([[0, 3, 2, 3], [1, 1, 2, 3]]),
      masked=jnp.array([[False, False, True, False], [True] + [False] * 3]),
      corrupted=jnp.ones((2, 4), bool))
  out = masked_patches.apply(corruption, embeddings, jnp.full((1, 1, 3), -1.0))
  np.testing.assert_array_equal(out[0], [embeddings[0, 0], embeddings[0, 3],
                                         [-1, -1, -1], embeddings[0, 3]])
  np.testing.assert_array_equal(out[1], [[-1, -1, -1], embeddings[1, 1],
                                         embeddings[1, 2], embeddings[1, 3]])


def mpp_digits(data_dir, **overrides):
  config = mpp_config.get_config("digits")
  config.update_from_flattened_dict({
      **SMALL, "data_dir": data_dir, "total_steps": 40, "log_every": 10,
      "checkpoint_every": 40, "evaluators.test.every": 0,
      "optimizer.warmup_steps": 5, **overrides})
  return config


def test_a_classifying_evaluator_is_refused_for_mpp(digits_data_dir, tmp_path):
  config = mpp_digits(digits_data_dir, **{"evaluators.test.every": 10})
  with pytest.raises(errors.ConfigError, match="set their `every` to 0"):
    run_training(config, str(tmp_path))


def test_mpp_pretraining_on_digits_lowers_its_loss_and_then_fine_tunes(
    digits_data_dir, tmp_path):
  pretrain = str(tmp_path / "mpp")
  config = mpp_digits(digits_data_dir)
  run_training(config, pretrain)
  losses = [r["train_loss"] for r in writers.read_rows(pretrain)
            if "train_loss" in r]
  assert losses[0] < np.log(masked_patches.NUM_CLASSES) + 0.1
  assert losses[-1] < 0.5 * losses[0]
  _, trained, _ = latest_checkpoint(pretrain, config)
  assert trained["mpp_head"]["kernel"].shape == (32, 512)

  finetune = small_config(digits_data_dir, init_from=pretrain, total_steps=3,
                          **{"evaluators.test.every": 0})
  program = program_of(finetune)
  started = flax.traverse_util.flatten_dict(jax.device_get(
      step.initial_state(program, settings.of(finetune)).params), sep="/")
  pretrained = flax.traverse_util.flatten_dict(trained, sep="/")
  assert "mask_embedding" not in started
  for key, value in started.items():
    if key.startswith("head/"):
      assert not value.any()  # A fresh classifier.
    else:
      np.testing.assert_array_equal(value, pretrained[key], err_msg=key)
  result = run_training(finetune, str(tmp_path / "finetune"))
  assert np.isfinite(result["train_loss"])


def test_the_papers_mpp_config_is_b16_on_jft_and_passes_the_checks():
  config = mpp_config.get_config()
  assert (config.model.name, config.model.mpp, config.dataset) == (
      "B/16", True, "jft300m")
  assert (config.batch_size, config.total_steps) == (4096, 1_000_000)
  assert (config.optimizer.name, config.optimizer.learning_rate,
          config.optimizer.warmup_steps, config.optimizer.decay) == (
              "adam", 2e-4, 10_000, "cosine")
  resolve.check_program(resolve.check_values(settings.of(config)),
                        sharding.make_mesh(config.mesh), 10)


@pytest.mark.parametrize("packed", [False, True])
def test_naflex_and_packed_batches_are_refused_with_a_line(packed):
  """Masked patch prediction corrupts a square grid of patches: a NaFlex
  or packed batch is refused before anything is traced."""
  model = models.create("Ti/4", 10, hidden_size=16, num_layers=1, mlp_dim=32,
                        num_heads=2, mpp=True)
  pixels = jnp.zeros((1, 4, 4 * 4 * 3), jnp.uint8)
  grids = jnp.array([[[2, 2]]], jnp.int32)
  batch = naflex.Packed(pixels, jnp.ones((1, 4), jnp.int32),
                        jnp.zeros((1, 4, 2), jnp.int32), grids) if packed \
      else naflex.Patches(pixels, grids[:, 0])
  with pytest.raises(errors.InputError, match="takes square images"):
    model.init(jax.random.key(0), batch, train=False)
