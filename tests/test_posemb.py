"""Position embeddings (Appendix D.4): learn, learn2d, sincos2d and none;
and 2-D rotary embeddings (DINOv3's), which need no table."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.util import program_of, randomize, small_config, train_steps
from vit_jax import errors, models
from vit_jax.analysis import attention
from vit_jax.models import positions, rope, tokens as tokens_lib
from vit_jax.runs import settings
from vit_jax.runs.workdir import Workdir
from vit_jax.training import step
from vit_jax.weights import (
  adaptation,
  exports,
  npz as npz_lib,
  pretrained,
)
from vit_jax.weights.pytorch import hf, timm

ROW, COL = models.POSEMB_2D_KEYS


def test_sincos2d_codes_the_row_then_the_column():
  table = positions.sincos2d_table(3, 4, 8)  # Frequencies 1 and 1/100.
  assert table.shape == (12, 8)
  for r in range(3):
    for c in range(4):
      np.testing.assert_allclose(table[r * 4 + c], [
          np.sin(r), np.sin(r / 100), np.cos(r), np.cos(r / 100),
          np.sin(c), np.sin(c / 100), np.cos(c), np.cos(c / 100)], atol=1e-6)
  assert len(np.unique(table.round(5), axis=0)) == 12
  with pytest.raises(errors.InputError, match="divisible by 4"):
    positions.sincos2d_table(2, 2, 6)


def test_learn2d_patches_share_their_rows_and_columns_halves():
  module = positions.AddPositionEmbedding("learn2d")
  tokens = tokens_lib.of_grid(jnp.zeros((1, 1 + 12, 8)), (3, 4))
  params = flax.linen.meta.unbox(module.init(jax.random.key(0), tokens))
  table = np.asarray(module.apply(params, tokens))[0]
  row, col, token = (params["params"][f"{name}_embedding"]
                     for name in ("row", "col", "token"))
  assert row.shape == (3, 4) and col.shape == (4, 4)
  np.testing.assert_array_equal(table[0], token[0])
  grid = table[1:].reshape(3, 4, 8)
  for r in range(3):
    for c in range(4):
      np.testing.assert_array_equal(grid[r, c, :4], row[r])
      np.testing.assert_array_equal(grid[r, c, 4:], col[c])


def shuffled_patches(images, patch, order):
  """`images` with their patch x patch tiles moved: tile i goes to order[i]."""
  n, h, w, c = images.shape
  g = h // patch
  tiles = images.reshape(n, g, patch, g, patch, c).transpose(0, 1, 3, 2, 4, 5)
  tiles = tiles.reshape(n, g * g, patch, patch, c)[:, np.argsort(order)]
  return tiles.reshape(n, g, g, patch, patch, c).transpose(
      0, 1, 3, 2, 4, 5).reshape(n, h, w, c)


@pytest.mark.parametrize("posemb", models.config.POSEMB_KINDS)
def test_only_without_position_embedding_does_a_gap_vit_ignore_patch_order(
    posemb):
  model = models.create("Ti/4", 10, hidden_size=32, num_layers=2, mlp_dim=64,
                        num_heads=4, classifier="gap", posemb=posemb)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3))
  params = flax.linen.meta.unbox(
      model.init(jax.random.key(0), images, train=False)["params"])
  # A random head: the zero-initialised one gives zero logits for anything.
  params["head"]["kernel"] = jax.random.normal(jax.random.key(1), (32, 10))
  order = np.random.default_rng(1).permutation(16)
  logits, moved = (model.apply({"params": params}, x, train=False)
                   for x in (images, shuffled_patches(images, 4, order)))
  if posemb == "none":
    np.testing.assert_allclose(moved, logits, atol=1e-5)
  else:
    assert np.abs(moved - logits).max() > 1e-3


# "learn", the default, trains in tests/test_train.py and fine-tunes at 16 px
# in tests/test_finetune.py.
@pytest.mark.parametrize("posemb,rope", [
    ("learn2d", ""), ("sincos2d", ""), ("none", ""), ("none", "axial")],
                         ids=["learn2d", "sincos2d", "none", "rope"])
def test_each_kind_trains_on_digits_and_fine_tunes_at_16_px(
    digits_data_dir, tmp_path, posemb, rope):
  config = small_config(digits_data_dir, total_steps=60, batch_size=64, **{
      "model.posemb": posemb, "model.rope": rope,
      "optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 10})
  program = program_of(config)
  losses, state = train_steps(program, program.init(jax.random.key(0)),
                              config, 60)
  assert np.mean(losses[-10:]) < 0.85 * np.mean(losses[:10])
  trained = flat(state.params)
  npz = str(tmp_path / "pretrained.npz")
  npz_lib.save_npz(state.params, npz)

  # At 16 px the 2 px patches make an 8 x 8 grid instead of 4 x 4.
  finetune = small_config(digits_data_dir, init_from=npz, image_size=16,
                          **{"model.posemb": posemb, "model.rope": rope})
  program = program_of(finetune)
  state = step.initial_state(program, settings.of(finetune))
  started = flat(state.params)
  tables = {k: v for k, v in started.items() if "posembed_input" in k}
  if posemb == "learn2d":
    for key in (ROW, COL):
      assert tables[key].shape == (8, 16)
      np.testing.assert_array_equal(tables.pop(key), adaptation.resize_table(
          trained[key], 8))
  for key, value in tables.items():  # The class token's stays as it was.
    np.testing.assert_array_equal(value, trained[key])
  losses, _ = train_steps(program, state, finetune, 3)
  assert np.isfinite(losses).all()


def flat(tree):
  return flax.traverse_util.flatten_dict(jax.device_get(tree), sep="/")


@pytest.mark.parametrize("posemb", models.config.POSEMB_KINDS)
def test_from_params_reads_the_kind_and_inspect_its_table(posemb):
  model = models.create("Ti/4", 10, hidden_size=32, num_layers=2, mlp_dim=64,
                        num_heads=4, posemb=posemb)
  params = flax.linen.meta.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 24, 24, 3)), train=False)["params"])
  if posemb in ("sincos2d", "none"):
    with pytest.raises(errors.InputError, match="posemb='sincos2d' or 'none'"):
      models.from_params(params)
  read, image_size = models.from_params(params, posemb)
  assert read == model
  assert image_size == (None if posemb in ("sincos2d", "none") else 24)
  table = attention.position_table(model, params, 24)
  if posemb == "none":
    assert table is None
  elif posemb == "learn":
    np.testing.assert_array_equal(table, params["Transformer"][
        "posembed_input"]["pos_embedding"])
  elif posemb == "sincos2d":
    np.testing.assert_array_equal(table[0, 0], 0)
    np.testing.assert_array_equal(table[0, 1:], positions.sincos2d_table(6, 6, 32))
  else:
    assert table.shape == (1, 37, 32)


def test_rope_turns_only_the_patches_and_reads_any_grid():
  """The class token and registers are not turned: with no position table,
  a patch's place reaches them only through attention. Any grid is read
  with no table to resize, and the patches' order matters."""
  model = models.create("Ti/4", 10, hidden_size=32, num_layers=1, mlp_dim=64,
                        num_heads=4, posemb="none", rope="axial",
                        num_registers=2)
  params = flax.linen.meta.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 8, 8, 3)), train=False)["params"])
  images = jax.random.uniform(jax.random.key(1), (2, 8, 16, 3), minval=-1)
  _, features = models.logits_and_pre_logits(model, params, images)
  assert features.shape == (2, 32)
  _, flipped = models.logits_and_pre_logits(model, params,
                                            images[:, :, ::-1])
  assert np.abs(flipped - features).max() > 1e-3
  tokens = jnp.ones((1, 3 + 4, 2, 8))
  angles = jnp.full((1, 4, 4), 0.5)
  turned = rope.rotate(tokens, angles)
  np.testing.assert_array_equal(turned[:, :3], tokens[:, :3])
  np.testing.assert_allclose(turned[0, 3:, 0], np.concatenate(
      [np.full((4, 4), np.cos(0.5) - np.sin(0.5)),
       np.full((4, 4), np.cos(0.5) + np.sin(0.5))], axis=1), rtol=1e-6)


def test_a_rope_model_with_a_table_is_refused_by_pytorchs_layouts_and_npz_says_so():
  model = models.create("Ti/4", 10, hidden_size=32, num_layers=1, mlp_dim=64,
                        num_heads=4, rope="axial")
  params = flax.linen.meta.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 8, 8, 3)), train=False)["params"])
  function = {**models.FUNCTION_OPTIONS, "rope": "axial"}
  flat_params = flax.traverse_util.flatten_dict(params, sep="/")
  with pytest.raises(errors.InputError, match="timm Eva: the model has a "
                     "position table"):
    timm.write_timm("unused.safetensors", flat_params, function,
                    "the run")
  with pytest.raises(errors.InputError, match="rotary embeddings"):
    hf.write_hf("unused", flat_params, function, None, "the run")
  loaded = pretrained.Checkpoint(params, "the run", function)
  (warning,) = exports.function_warnings(loaded, "npz")
  assert "--config.model.rope=axial" in warning
  # A checkpoint that carries the function computes it.
  inference = pretrained.inference_of(loaded)
  assert inference.model.config.rope == "axial"


def test_a_fine_tune_of_a_rope_run_computes_rope_with_no_flag(tmp_path):
  """rope and rope_theta are the source's function: left unset, a fine-tune
  takes them from the run it starts from; set against it, they win."""
  source = settings.of(small_config(str(tmp_path), **{
      "model.posemb": "none", "model.rope": "axial",
      "model.rope_theta": 10.0}))
  Workdir(tmp_path / "run").write_config(source)
  config = small_config(str(tmp_path), init_from=str(tmp_path / "run"),
                        **{"model.posemb": "none"})
  assert config.model.rope is None  # Unset: the source's.
  model = pretrained.with_source(settings.of(config)).model
  assert (model.rope, model.rope_theta) == ("axial", 10.0)
  config.model.rope = ""
  assert pretrained.with_source(settings.of(config)).model.rope == ""


def test_ropes_training_draws_move_each_images_coordinates():
  """rope_shift, rope_jitter and rope_rescale (DINOv3's training draws):
  one translation, per-axis scale and common scale per image, drawn from
  the step's dropout key; evaluation turns by the plain grid."""
  # A 4 x 2 grid's patch centres (none at 0, for the ratios below).
  coords = jnp.asarray(np.stack(np.meshgrid(np.linspace(-0.75, 0.75, 4),
                                            np.linspace(-0.5, 0.5, 2),
                                            indexing="ij"), -1).reshape(1, -1, 2))
  coords = jnp.broadcast_to(coords, (3, 8, 2))
  key = jax.random.key(0)
  shifted = rope.augment(coords, rope.Augmentation(shift=0.25), key)
  moved = np.asarray(shifted - coords)
  np.testing.assert_allclose(moved, np.broadcast_to(moved[:, :1], moved.shape),
                             atol=1e-6)  # A translation.
  assert np.abs(moved).max() <= 0.25 and len(set(moved[:, 0, 0])) == 3
  jittered = rope.augment(coords, rope.Augmentation(jitter=2.0), key)
  scale = np.asarray(jittered / coords)
  np.testing.assert_allclose(scale, np.broadcast_to(scale[:, :1], scale.shape),
                             rtol=1e-5)  # Per axis.
  assert ((scale >= 0.5) & (scale <= 2.0)).all()
  rescaled = rope.augment(coords, rope.Augmentation(rescale=2.0), key)
  scale = np.asarray(rescaled / coords)
  np.testing.assert_allclose(scale, np.broadcast_to(scale[:, :1, :1],
                                                    scale.shape), rtol=1e-5)
  np.testing.assert_array_equal(
      rope.augment(coords, rope.Augmentation(), key), coords)

  model = models.create("Ti/4", 10, hidden_size=32, num_layers=1, mlp_dim=64,
                        num_heads=4, rope="axial", posemb="none",
                        dropout_rate=0.0, rope_shift=0.5, rope_jitter=1.5,
                        rope_rescale=2.0)
  x = jnp.broadcast_to(jax.random.uniform(jax.random.key(1), (1, 8, 8, 3)),
                       (2, 8, 8, 3))
  params = randomize(flax.linen.meta.unbox(model.init(
      jax.random.key(0), x[:1], train=False)["params"]))
  plain = model.apply({"params": params}, x, train=False)
  train = lambda seed: model.apply({"params": params}, x, train=True,
                                   rngs={"dropout": jax.random.key(seed)})
  np.testing.assert_array_equal(train(3), train(3))
  assert np.abs(train(3)[0] - train(3)[1]).max() > 1e-4  # Per image.
  assert np.abs(train(3) - plain).max() > 1e-4
  plain_model = models.create("Ti/4", 10, hidden_size=32, num_layers=1,
                              mlp_dim=64, num_heads=4, rope="axial",
                              posemb="none", dropout_rate=0.0)
  np.testing.assert_array_equal(
      plain_model.apply({"params": params}, x, train=True,
                        rngs={"dropout": jax.random.key(3)}), plain)


def test_a_rope_kind_or_head_width_that_cannot_turn_is_refused():
  with pytest.raises(errors.InputError, match="rope must be one of"):
    models.create("Ti/4", 10, hidden_size=32, num_heads=4, rope="cat")
  with pytest.raises(errors.InputError, match="divisible by 4"):
    models.create("Ti/4", 10, hidden_size=24, num_heads=4, rope="mixed")
