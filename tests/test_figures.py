"""vit_jax.analysis's numbers on hand-made attention, and its figures for a
digits run and for a released-layout .npz; vit_jax.predict on digits."""

import functools
import json
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import reference_vit
from tests.test_naflex import patchify
from tests.test_todays_checkpoints import REGISTERS, eva_dinov3_file
from tests.test_torch_interchange import HEADS, PATCH, WIDTH
from tests.util import (
  call_tool,
  randomize,
  run_tool,
)
from vit_jax import errors, models
from vit_jax.analysis import (
  attention as attention_lib,
  classify,
  components,
  plots,
)
from vit_jax.data import image_files
from vit_jax.models import naflex
from vit_jax.runs import settings
from vit_jax.weights import npz, pretrained

# timm's IMAGENET_DEFAULT_MEAN and IMAGENET_DEFAULT_STD.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# NaFlex (images at their own aspect ratios) draws these; square images
# their patch features' components too.
NAFLEX_FIGURES = ("embedding_filters.png", "position_embedding_similarity.png",
                  "mean_attention_distance.png", "attention_rollout.png")
FIGURES = NAFLEX_FIGURES + ("patch_components.png",)


def uniform(layers, images, heads, tokens):
  return np.full((layers, images, heads, tokens, tokens), 1 / tokens)


@pytest.mark.parametrize("class_token", [True, False])
def test_rollout_of_uniform_attention_is_uniform(class_token):
  tokens = 9 + class_token
  rollout = attention_lib.attention_rollout(uniform(3, 2, 4, tokens),
                                            class_token)
  assert rollout.shape == (2, 3, 3)
  np.testing.assert_allclose(rollout, rollout[0, 0, 0], rtol=1e-12)
  assert rollout[0, 0, 0] > 0


def test_rollout_follows_the_class_token_to_its_patch():
  # One layer, the class token attends only to patch 5 (token 6); with the
  # residual, half its output is itself and half patch 5.
  attention = np.zeros((1, 1, 2, 10, 10))
  attention[..., :, 0] = 1  # Every row attends to the class token ...
  attention[..., 0, :] = 0
  attention[..., 0, 6] = 1  # ... but the class token's own row.
  rollout = attention_lib.attention_rollout(attention)
  expected = np.zeros((1, 3, 3))
  expected[0, 1, 2] = 0.5
  np.testing.assert_allclose(rollout, expected)


def test_mean_attention_distance_of_hand_built_patterns():
  # A 2x2 grid of 16-pixel patches and a class token (token 0).
  patch, tokens = 16, 5
  attention = np.zeros((2, 3, 2, tokens, tokens))
  # Layer 0, head 0: every patch attends to patch 0 and to the class token,
  # which is left out: distances 0, 16, 16 and 16 * sqrt(2).
  attention[0, :, 0, :, 1] = 0.5
  attention[0, :, 0, :, 0] = 0.5
  # Layer 0, head 1: every patch attends to itself.
  attention[0, :, 1] = np.eye(tokens)
  # Layer 1, both heads: patch (r, c) attends to the patch diagonally
  # across, 16 * sqrt(2) away.
  for query, key in ((1, 4), (2, 3), (3, 2), (4, 1)):
    attention[1, :, :, query, key] = 1
  distances = attention_lib.mean_attention_distance(attention, grid_size=2,
                                              patch_size=patch)
  assert distances.shape == (2, 2)
  np.testing.assert_allclose(distances, [
      [(0 + 16 + 16 + 16 * np.sqrt(2)) / 4, 0],
      [16 * np.sqrt(2), 16 * np.sqrt(2)]])
  # A GAP model has no class token to leave out.
  gap = attention_lib.mean_attention_distance(attention[..., 1:, 1:], 2, patch,
                                        class_token=False)
  np.testing.assert_allclose(gap, distances)


def test_mean_attention_distance_and_rollout_on_a_wide_grid():
  # A 1x3 grid of 16-pixel patches (NaFlex: an image three times as wide as
  # high) and a class token: patch 0 attends to patch 2, 32 pixels away;
  # patch 1 to patches 0 and 2, 16 away; patch 2 to itself.
  attention = np.zeros((1, 1, 1, 4, 4))
  attention[..., 0, 3] = 1  # The class token reads patch 2 only.
  attention[..., 1, 3] = 1
  attention[..., 2, 1] = attention[..., 2, 3] = 0.5
  attention[..., 3, 3] = 1
  distances = attention_lib.mean_attention_distance(attention, (1, 3), 16)
  np.testing.assert_allclose(distances, [[(32 + 16 + 0) / 3]])
  rollout = attention_lib.attention_rollout(attention, grid=(1, 3))
  np.testing.assert_allclose(rollout, [[[0, 0, 0.5]]])
  # The same grid stood up, 3x1: the same distances in the other direction.
  np.testing.assert_allclose(
      attention_lib.mean_attention_distance(attention, (3, 1), 16), distances)
  # Attention spread evenly over a 1x3 grid reaches (16 + 32 + 16 + 16 + 32
  # + 16) / 9 pixels on average; over one 1x3 and one 1x1 image, half that.
  assert attention_lib.uniform_distance([(1, 3)], 16) == pytest.approx(
      128 / 9)
  assert attention_lib.uniform_distance([(1, 3), (1, 1)], 16) == (
      pytest.approx(64 / 9))


def with_registers(attention, count, class_token=True):
  """`attention` over a class token (or none) and patches, with `count`
  registers put after the class token, attending to themselves only and
  read by no other token."""
  *lead, tokens, _ = attention.shape
  first = int(class_token)
  grown = np.zeros((*lead, tokens + count, tokens + count))
  kept = np.r_[0:first, first + count:tokens + count]
  grown[..., kept[:, None], kept] = attention
  added = np.arange(first, first + count)
  grown[..., added, added] = 1
  return grown


def test_registers_are_left_out_of_the_distances_and_the_rollout():
  """A DINOv3's registers: the distances are over the patches' weights on
  the patches, renormalised, whatever the patches give the registers; a
  rollout through registers no one reads is the one without them."""
  attention = np.zeros((1, 2, 3, 5, 5))
  rng = np.random.default_rng(0)
  attention[..., 1:, 1:] = rng.uniform(size=(1, 2, 3, 4, 4))
  attention[..., 0, 3] = 1
  attention /= attention.sum(-1, keepdims=True)
  distances = attention_lib.mean_attention_distance(attention, 2, 16)
  registers = with_registers(attention, 2)
  np.testing.assert_allclose(
      attention_lib.mean_attention_distance(registers, 2, 16,
                                            num_registers=2), distances)
  registers[..., 3:, 1] = 0.7  # The patches' weight on a register.
  registers /= registers.sum(-1, keepdims=True)
  np.testing.assert_allclose(
      attention_lib.mean_attention_distance(registers, 2, 16,
                                            num_registers=2), distances)
  np.testing.assert_allclose(
      attention_lib.attention_rollout(with_registers(attention, 2),
                                      num_registers=2),
      attention_lib.attention_rollout(attention))
  gap = attention[..., 1:, 1:] / attention[..., 1:, 1:].sum(-1,
                                                            keepdims=True)
  np.testing.assert_allclose(
      attention_lib.attention_rollout(with_registers(gap, 2, False), False,
                                      num_registers=2),
      attention_lib.attention_rollout(gap, False), rtol=1e-12)


def test_figures_of_a_headless_dinov3_with_registers(tmp_path, monkeypatch):
  """A timm DINOv3 (no head, no position table, 5 prefix tokens): its
  filters, attention distances and rollout, at each image's own grid. The
  numbers each figure draws are those of timm's model (its attention from
  tests/reference_vit.py), computed here from their definitions: the
  patches' attention to the patches, the class token and the registers
  left out."""
  tensors, path = eva_dinov3_file(tmp_path)
  pixels = np.random.default_rng(4).integers(0, 256, (12, 20, 3), np.uint8)
  png = str(tmp_path / "wide.png")
  with open(png, "wb") as f:
    f.write(tf_png(pixels))
  drawn = {}
  for name in ("embedding_filters", "attention_distance",
               "attention_rollout"):
    monkeypatch.setattr(plots, name, functools.partial(
        lambda draw, name, *args, **kwargs: drawn.update({name: args}) or (
            draw(*args, **kwargs)), getattr(plots, name), name))
  summary = attention_lib.attention_summary
  inputs = []
  monkeypatch.setattr(attention_lib, "attention_summary", lambda model, params,
                      batch, *args: inputs.append(batch) or summary(
                          model, params, batch, *args))
  out = tmp_path / "figures"
  status, stdout, stderr = call_tool(
      "figures", f"--from={path}", f"--num_heads={HEADS}", f"--out={out}",
      "--max_num_patches=64", png)
  assert status == 0, stderr[-3000:]
  written = sorted(os.listdir(out))
  assert written == ["attention_rollout.png", "embedding_filters.png",
                     "mean_attention_distance.png"], stdout
  assert_pngs(out, written)

  # The image as the model saw it: its patches (pixels 0 to 255) at their
  # grid; timm's model takes it as it was trained, normalised by ImageNet's
  # mean and std (a timm file off the hub says nothing of its input).
  assert "assuming --input_mean=0.485,0.456,0.406 --input_std=0.229,0.224," \
      "0.225" in stderr, stderr
  (batch,) = inputs
  (rows, cols), = np.asarray(batch.grid)
  assert rows * cols <= 64 and (rows, cols) != (1, 1)
  image = np.asarray(batch.pixels[0, :rows * cols], np.float64).reshape(
      rows, cols, PATCH, PATCH, 3).transpose(0, 2, 1, 3, 4).reshape(
          1, rows * PATCH, cols * PATCH, 3)
  assert image.min() >= 0 and image.max() <= 255 and image.max() > 1
  mean = np.array(IMAGENET_MEAN)
  std = np.array(IMAGENET_STD)
  attention = []
  reference_vit.forward_eva_dinov3(tensors, (image / 255 - mean) / std,
                                   HEADS, attention=attention)
  prefix = 1 + REGISTERS
  patches = rows * cols
  centres = [np.array(divmod(q, cols)) * PATCH for q in range(patches)]
  expected_distances = np.zeros((len(attention), HEADS))
  for layer, weights in enumerate(attention):
    for head in range(HEADS):
      for q in range(patches):
        on_patches = weights[0, head, prefix + q, prefix:]
        on_patches = on_patches / on_patches.sum()
        expected_distances[layer, head] += sum(
            w * np.linalg.norm(centres[q] - centres[k])
            for k, w in enumerate(on_patches)) / patches
  distances, uniform, image_size = drawn["attention_distance"][:3]
  np.testing.assert_allclose(distances, expected_distances, rtol=1e-4)
  assert image_size == max(rows, cols) * PATCH
  np.testing.assert_allclose(uniform, np.mean(
      [np.linalg.norm(a - b) for a in centres for b in centres]))

  # Rollout: the heads averaged, the residual added, rows renormalised,
  # the layers multiplied (the first on the right); a GAP model's map is
  # what the patches draw from each patch, on average over them.
  flow = np.eye(prefix + patches)
  for weights in attention:
    mixed = weights[0].mean(axis=0) + np.eye(prefix + patches)
    flow = (mixed / mixed.sum(axis=-1, keepdims=True)) @ flow
  expected_map = flow[prefix:, prefix:].mean(axis=0).reshape(rows, cols)
  shown, (drawn_map,) = drawn["attention_rollout"][:2]
  np.testing.assert_allclose(drawn_map, expected_map, rtol=1e-4)
  assert shown[0].shape == (rows * PATCH, cols * PATCH, 3)

  # The filters: principal components of timm's patch embedding as it
  # applies to images in [-1, 1] (each input channel's weights over 2 std),
  # each filter flattened as (row, column, channel).
  components, explained = drawn["embedding_filters"][:2]
  filters = (tensors["patch_embed.proj.weight"].astype(np.float64).transpose(
      0, 2, 3, 1) / (2 * std)).reshape(WIDTH, -1)
  singular = np.linalg.svd(filters - filters.mean(axis=0),
                           compute_uv=False)
  np.testing.assert_allclose(explained, (singular**2 / (singular**2).sum())[
      :len(explained)], rtol=1e-4, atol=1e-7)
  assert components.shape == (len(explained), PATCH, PATCH, 3)


def tf_png(pixels):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.encode_png(pixels).numpy()


def test_position_similarity_is_one_on_the_diagonal():
  posemb = np.random.default_rng(0).standard_normal((1, 1 + 16, 8))
  posemb[0, 1 + 5] = 3 * posemb[0, 1 + 2]  # Patches (1, 1) and (0, 2).
  similarity = attention_lib.position_similarity(posemb)
  assert similarity.shape == (4, 4, 4, 4)
  flat = similarity.reshape(16, 16)
  np.testing.assert_allclose(np.diag(flat), 1)
  np.testing.assert_allclose(flat, flat.T)
  assert similarity[1, 1, 0, 2] == pytest.approx(1)
  assert np.all(np.abs(flat) <= 1 + 1e-12)


def test_embedding_components_find_the_filters_directions():
  rng = np.random.default_rng(0)
  strong, weak = np.linalg.qr(rng.standard_normal((2 * 2 * 3, 2)))[0].T
  # 64 filters made of two directions, one with 3x the spread.
  filters = (np.outer(3 * rng.standard_normal(64), strong)
             + np.outer(rng.standard_normal(64), weak))
  kernel = filters.T.reshape(2, 2, 3, 64)
  components, explained = attention_lib.embedding_components(kernel, count=28)
  assert components.shape == (12, 2, 2, 3)  # At most 2 * 2 * 3 of them.
  assert abs(components[0].ravel() @ strong) == pytest.approx(1, abs=1e-2)
  assert abs(components[1].ravel() @ weak) == pytest.approx(1, abs=1e-2)
  assert explained[:2].sum() == pytest.approx(1)
  assert explained[0] > 0.8


def test_patch_components_are_the_features_principal_directions():
  rng = np.random.default_rng(0)
  directions = np.linalg.qr(rng.standard_normal((16, 3)))[0].T
  # 2 images of 4 x 5 patches: three directions, with uncorrelated
  # coefficients of spreads 4, 2 and 1.
  draws = rng.standard_normal((40, 3))
  coefficients = np.linalg.qr(draws - draws.mean(0))[0] * [4, 2, 1]
  features = (coefficients @ directions + 1e-4 * rng.standard_normal(
      (40, 16)) + 5).reshape(2, 4, 5, 16)
  colours, shares = components.as_colours(features)
  assert colours.shape == (2, 4, 5, 3)
  flat = colours.reshape(40, 3)
  np.testing.assert_allclose(flat.min(0), 0, atol=1e-6)
  np.testing.assert_allclose(flat.max(0), 1, atol=1e-6)
  for c in range(3):  # Each colour is one direction's coefficient.
    assert abs(np.corrcoef(flat[:, c], coefficients[:, c])[0, 1]) > 0.999
  assert shares[0] > shares[1] > shares[2] and shares.sum() > 0.99
  # One fit over all the images: in another order, each keeps its colours.
  np.testing.assert_allclose(components.as_colours(features[::-1])[0],
                             colours[::-1], atol=1e-5)


def test_patch_features_are_the_encoders_patch_tokens_on_the_grid():
  """Row-major: the token of the patch at row r, column c after the
  class token and the registers."""
  model = models.create("Ti/4", num_classes=5, hidden_size=32, num_layers=1,
                        mlp_dim=64, num_heads=4, num_registers=2)
  images = np.random.default_rng(0).uniform(-1, 1, (3, 12, 16, 3)).astype(
      np.float32)
  params = randomize(nn.meta.unbox(model.init(
      jax.random.key(0), images, train=False)["params"]))
  features = components.patch_features(model, params, images, batch_size=2)
  assert features.shape == (3, 3, 4, 32)
  tokens = np.asarray(model.apply({"params": params}, images, method=lambda
                                  m, x: m.encoder(x, train=False).values))
  assert tokens.shape[1] == 1 + 2 + 12
  # (In batches of 2 against 3 at once: float32 rounding apart.)
  np.testing.assert_allclose(features[:, 1, 2], tokens[:, 3 + 1 * 4 + 2],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(features.reshape(3, 12, 32), tokens[:, 3:],
                             rtol=1e-5, atol=1e-5)


def test_attention_weights_are_the_models_own():
  model = models.create("Ti/4", num_classes=5, hidden_size=32, num_layers=3,
                        mlp_dim=64, num_heads=4)
  params = randomize(nn.meta.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)["params"]))
  pixels = np.random.default_rng(1).integers(0, 256, (4, 16, 16, 3), np.uint8)
  logits, attention = attention_lib.attention_weights(model, params, pixels)
  apply = jax.jit(functools.partial(model.apply, train=False))
  np.testing.assert_allclose(logits, apply({"params": params}, pixels),
                             rtol=1e-5, atol=1e-6)
  assert attention.shape == (3, 4, 4, 17, 17)
  np.testing.assert_allclose(attention.sum(-1), 1, rtol=1e-5)
  # A batch at a time, as for the figures, gives the same numbers.
  summary_logits, distances, maps = attention_lib.attention_summary(
      model, params, pixels, rollout_count=3, batch_size=2)
  np.testing.assert_allclose(summary_logits, logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(distances, attention_lib.mean_attention_distance(
      attention, 4, 4), rtol=1e-5)
  np.testing.assert_allclose(maps,
                             attention_lib.attention_rollout(attention[:, :3]),
                             rtol=1e-5)
  # A model with the fused attention, which keeps no weights, has them read
  # through the einsum's.
  fused = models.create("Ti/4", num_classes=5, hidden_size=32, num_layers=3,
                        mlp_dim=64, num_heads=4, attention="fused")
  np.testing.assert_array_equal(
      attention_lib.attention_weights(fused, params, pixels)[1], attention)
  # Layer order: a change to the last block changes only the last layer's.
  params["Transformer"]["encoderblock_2"]["LayerNorm_0"]["scale"] *= 2
  _, changed = attention_lib.attention_weights(model, params, pixels)
  np.testing.assert_allclose(changed[:2], attention[:2], rtol=1e-5)
  assert not np.allclose(changed[2], attention[2])


def test_naflex_attention_summary_is_the_square_ones_whatever_the_padding():
  # Square images read as NaFlex patches at their own grid give the square
  # path's numbers, however much padding follows their patches; a wide image
  # has a map of its own shape and is shown as the model saw it.
  model = models.create("Ti/4", num_classes=5, hidden_size=32, num_layers=2,
                        mlp_dim=64, num_heads=4)
  params = randomize(nn.meta.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)["params"]))
  rng = np.random.default_rng(2)
  pixels = rng.integers(0, 256, (3, 16, 16, 3), np.uint8)
  wide = rng.integers(0, 256, (8, 24, 3), np.uint8)  # 2 x 6 patches.
  square = attention_lib.attention_summary(model, params, pixels, 3, 2)
  for budget in (16, 21):
    patches, grids = zip(*(patchify(x, 4, budget) for x in pixels))
    inputs = naflex.Patches(np.stack(patches), np.array(grids, np.int32))
    logits, distances, maps = attention_lib.attention_summary(
        model, params, inputs, 3, 2)
    np.testing.assert_allclose(logits, square[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(distances, square[1], rtol=1e-4)
    np.testing.assert_allclose(maps, square[2], rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(
        attention_lib.pictures(model, inputs), pixels)

  patches, grid = patchify(wide, 4, 21)
  mixed = naflex.Patches(np.stack([inputs.pixels[0], patches]),
                         np.array([grids[0], grid], np.int32))
  _, _, maps = attention_lib.attention_summary(model, params, mixed, 2)
  assert [m.shape for m in maps] == [(4, 4), (2, 6)]
  np.testing.assert_allclose(maps[0], square[2][0], rtol=1e-4, atol=1e-7)
  np.testing.assert_array_equal(attention_lib.pictures(model, mixed)[1], wide)


def test_unreadable_images_are_named():
  with pytest.raises(errors.InputError, match="no image at"):
    image_files.expand(["/nonexistent/*.png"])


def test_a_file_that_is_no_image_is_named(tmp_path):
  path = tmp_path / "notes.png"
  path.write_text("not an image")
  with pytest.raises(errors.InputError, match="notes.png is not an image"):
    image_files.from_files([str(path)], 8)


# What each figure draws, at least: the share of its pixels not near white
# (panels, images, curves; titles and empty axes make a few percent), and
# how many pixels are in colour (text, axes and grids are grey). About half
# of what the figures of the tests' runs and random weights have; a
# figure's width follows its title, which may name a path, hence a count.
DRAWN = {
    "embedding_filters.png": (0.2, 20_000),  # Each component an RGB patch.
    "position_embedding_similarity.png": (0.2, 20_000),  # Viridis tiles.
    # A dot per layer and head (the legend's own dots for 3 heads: 135).
    "mean_attention_distance.png": (0.01, 250),
    "attention_rollout.png": (0.15, 0),  # The images (digits are grey).
    "patch_components.png": (0.15, 2_000),  # A colour a patch.
    "training_curves.png": (0.04, 5_000),  # A line per metric.
}


def assert_pngs(out, names):
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  for name in names:
    path = os.path.join(out, name)
    assert os.path.getsize(path) > 1000, name
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 100, name
    assert pixels.ndim == 3 and pixels.shape[1] > 100, (name, pixels.shape)
    assert pixels.shape[2] in (3, 4), (name, pixels.shape)
    rgb = pixels[..., :3]
    assert np.ptp(rgb) > 0.5, name  # Not one colour.
    ink = (rgb < 0.9).any(axis=-1).mean()
    colour = int((np.ptp(rgb, axis=-1) > 0.15).sum())
    least_ink, least_colour = DRAWN[name]
    assert ink >= least_ink and colour >= least_colour, (name, ink, colour)


def test_figures_of_a_digits_run(digits_run):
  workdir, _, _, _ = digits_run
  stdout = run_tool("figures", f"--workdir={workdir}")
  out = os.path.join(workdir, "figures")
  assert_pngs(out, FIGURES + ("training_curves.png",))
  assert stdout.count("wrote ") == 6


def test_figures_of_a_released_layout_npz(tmp_path):
  model = models.create("B/8", num_classes=3, hidden_size=24, num_layers=2,
                        mlp_dim=48, num_heads=3, classifier="gap",
                        representation_size=16)
  params = randomize(model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)),
                                train=False)["params"])
  npz.save_npz(params, tmp_path / "model.npz")
  rng = np.random.default_rng(0)
  # Images of other sizes and formats, resized to the model's 32 px.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for name, size, encode in (("a.png", 40, tf.io.encode_png),
                             ("b.jpg", 64, tf.io.encode_jpeg)):
    pixels = rng.integers(0, 256, (size, size, 3), np.uint8)
    (tmp_path / name).write_bytes(encode(pixels).numpy())
  out = tmp_path / "figures"
  run_tool("figures", f"--from={tmp_path / 'model.npz'}", f"--out={out}",
           str(tmp_path / "a.png"), str(tmp_path / "b.jpg"))
  assert_pngs(out, FIGURES)
  assert sorted(os.listdir(out)) == sorted(FIGURES)
  # NaFlex: each image at its own aspect ratio, within 24 patches of 8 px.
  pixels = rng.integers(0, 256, (20, 90, 3), np.uint8)
  (tmp_path / "wide.png").write_bytes(tf.io.encode_png(pixels).numpy())
  out = tmp_path / "naflex"
  run_tool("figures", f"--from={tmp_path / 'model.npz'}", f"--out={out}",
           "--max_num_patches=24", str(tmp_path / "wide.png"),
           str(tmp_path / "a.png"))
  assert_pngs(out, NAFLEX_FIGURES)
  assert sorted(os.listdir(out)) == sorted(NAFLEX_FIGURES)


def test_predict_agrees_with_the_evaluator(digits_run, tmp_path):
  workdir, pngs, evaluator_accuracy, _ = digits_run
  assert evaluator_accuracy > 0.5  # Chance is 0.1: the comparison means something.
  names = tmp_path / "names.txt"
  names.write_text("\n".join(f"digit {d}" for d in range(10)))
  rows = [json.loads(line) for line in run_tool(
      "predict", f"--workdir={workdir}", f"--images={pngs}", "--json",
      "--top=3", f"--labels={names}").splitlines()]
  assert len(rows) == 360
  correct = 0
  for row in rows:
    label = int(re.search(r"_(\d)\.png$", row["image"]).group(1))
    probs = [entry["probability"] for entry in row["top"]]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True)
    assert sum(probs) <= 1 + 1e-6
    assert all(entry["name"] == f"digit {entry['class']}"
               for entry in row["top"])
    correct += row["top"][0]["class"] == label
  # The evaluator ran sharded over 8 devices, predict on one: one example
  # whose two best logits nearly tie may go either way.
  assert abs(correct / 360 - evaluator_accuracy) <= 1 / 360


def test_a_scanned_run_loads_as_the_plain_model(digits_run):
  workdir, _, _, config = digits_run
  inference = pretrained.for_inference(workdir)
  assert not inference.model.config.scan_layers and inference.image_size == 8
  assert inference.model.config.num_layers == config.model.num_layers
  run_params, _ = pretrained.load_run(workdir)  # Stacked blocks.
  pixels = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3), np.uint8)
  np.testing.assert_allclose(
      inference.model.apply({"params": inference.params}, pixels,
                            train=False),
      models.create_from_settings(settings.of(config).model, 10).apply(
          {"params": run_params}, pixels, train=False), rtol=1e-5, atol=1e-6)


def test_top_classes_are_named_ordered_and_printed():
  probs = np.array([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
  tops = classify.top_classes(probs, 2, ["a", "b", "c"])
  assert tops == [[(1, "b", 0.6), (2, "c", 0.3)],
                  [(0, "a", 0.5), (2, "c", 0.3)]]
  assert classify.top_classes(probs, 5)[0][2] == (0, "class 0", 0.1)
  assert classify.as_text("x.png", tops[0]) == (
      "x.png\n  1.  60.00%  b\n  2.  30.00%  c")
