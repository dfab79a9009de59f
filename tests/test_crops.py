"""DINOv2's multi-crop augmentation on the device (training/crops.py): its
shapes and range, each row's draws its own, the crop box's distribution,
the resize against PIL's, each colour op against a reference written here,
and the same crops on one device or sharded over eight."""

import colorsys
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from vit_jax.training import crops

# Tiny sizes keep the compiles short: 16 x 16 images, crops of 8 and 4;
# batches of 8 rows, the most tests', so that one compile serves them.
SMALL = crops.CropSpec(global_size=8, local_size=4, num_local=3)
# Every op off, the box the whole image.
PLAIN = crops.CropSpec(
    num_global=1, global_size=8, global_scale=(1.0, 1.0), num_local=0,
    local_size=4, ratio=(1.0, 1.0), flip_prob=0.0, jitter_prob=0.0,
    grey_prob=0.0,
    global_blur_prob=(0.0, 0.0), global_solarize_prob=(0.0, 0.0))

multi_crop = jax.jit(crops.multi_crop, static_argnums=2)


def random_images(seed, rows, size=16):
  return np.random.default_rng(seed).integers(
      0, 256, (rows, size, size, 3), dtype=np.uint8)


def test_shapes_and_range():
  global_crops, local_crops = multi_crop(random_images(0, 8),
                                         jax.random.key(0), SMALL)
  assert global_crops.shape == (8, 2, 8, 8, 3)
  assert local_crops.shape == (8, 3, 4, 4, 3)
  for x in (global_crops, local_crops):
    assert x.dtype == jnp.float32
    assert np.all(np.isfinite(x)) and x.min() >= -1 and x.max() <= 1
  # Each crop its own draws.
  flat = np.asarray(global_crops).reshape(16, -1)
  assert len({row.tobytes() for row in flat}) == 16
  # No local crops: test_the_whole_image_with_every_op_off_is_its_resize.


def test_a_row_draws_from_its_index_only():
  a = random_images(1, 8)
  b = random_images(2, 8)
  b[2] = a[2]
  key = jax.random.key(7)
  crops_a = multi_crop(a, key, SMALL)
  crops_b = multi_crop(b, key, SMALL)
  for x, y in zip(crops_a, crops_b):
    np.testing.assert_array_equal(x[2], y[2])
    assert not np.array_equal(x[1], y[1])
  # The same image at two rows is cropped differently.
  same = np.repeat(a[:1], 8, axis=0)
  global_crops, _ = multi_crop(same, key, SMALL)
  assert not np.array_equal(global_crops[0], global_crops[1])


def test_the_whole_image_with_every_op_off_is_its_resize():
  ramp = np.linspace(0, 255, 16)
  smooth = np.stack([ramp[:, None] + 0 * ramp[None, :],
                     0 * ramp[:, None] + ramp[None, :],
                     np.full((16, 16), 90.0)], -1)
  constant = np.full((16, 16, 3), 200.0)
  images = np.stack([smooth, constant]).round().astype(np.uint8)
  global_crops, local_crops = multi_crop(images, jax.random.key(3), PLAIN)
  assert global_crops.shape == (2, 1, 8, 8, 3)
  assert local_crops.shape == (2, 0, 4, 4, 3)  # num_local 0.
  expected = jax.image.resize(images[0] / 255, (8, 8, 3), "cubic",
                              antialias=True)
  np.testing.assert_allclose(global_crops[0, 0],
                             np.clip(expected, 0, 1) * 2 - 1, atol=1e-5)
  np.testing.assert_allclose(global_crops[1, 0], 200 / 127.5 - 1, atol=1e-5)
  # A flip is the mirror image.
  flipped, _ = multi_crop(images, jax.random.key(3),
                          dataclasses.replace(PLAIN, flip_prob=1.0))
  np.testing.assert_allclose(flipped[0, 0], global_crops[0, 0, :, ::-1],
                             atol=1e-6)


@pytest.mark.parametrize("box", [(3, 5, 5, 7), (1, 0, 14, 12), (0, 2, 4, 4)])
def test_resized_crop_is_pillows_crop_then_bicubic_resize(box):
  """PIL (which DINOv2's torchvision transforms call) on a float image,
  where it does not round: an upscale, a downscale (antialiased), a box
  at the image's edge."""
  image = np.random.default_rng(4).uniform(0.1, 0.9, (16, 16)).astype(
      np.float32)
  top, left, height, width = box
  size = 8 if height < 8 else 4
  pillow = Image.fromarray(image, mode="F").crop(
      (left, top, left + width, top + height)).resize(
          (size, size), Image.BICUBIC)
  ours = jax.jit(crops.resized_crop, static_argnums=2)(
      jnp.asarray(image)[..., None], tuple(map(jnp.int32, box)), size)
  # Where the cubic overshoots [0, 1], PIL's rounding to uint8 clips it.
  np.testing.assert_allclose(ours[..., 0], np.clip(pillow, 0, 1), atol=2e-5)


def test_crop_boxes_keep_to_the_scale_and_ratio_ranges():
  keys = jax.random.split(jax.random.key(5), 2000)
  side = 1000  # Large, so that rounding moves the area little.
  for scale in (crops.GLOBAL_SCALE, crops.LOCAL_SCALE):
    top, left, height, width = (np.asarray(a) for a in jax.jit(jax.vmap(
        lambda k, scale=scale: crops.crop_box(k, side, side, scale)))(keys))
    share = height * width / side**2
    assert share.min() >= scale[0] - 2e-3 and share.max() <= scale[1] + 2e-3
    # The draws cover the range, not one corner of it.
    assert share.min() < scale[0] + 0.05 and share.max() > scale[1] - 0.05
    aspect = width / height
    assert aspect.min() >= 3 / 4 - 2e-3 and aspect.max() <= 4 / 3 + 2e-3
    assert aspect.min() < 0.8 and aspect.max() > 1.25
    assert top.min() >= 0 and left.min() >= 0
    assert (top + height).max() <= side and (left + width).max() <= side
    # Positions spread over the image.
    assert top.std() > 10 and left.std() > 10


def test_a_crop_that_never_fits_falls_back_to_the_central_box():
  # Ratios of 2 to 3 at nearly the whole area are wider than the image.
  top, left, height, width = crops.crop_box(
      jax.random.key(6), 20, 20, (0.9, 1.0), ratio=(2.0, 3.0))
  assert (int(top), int(left), int(height), int(width)) == (5, 0, 10, 20)


def test_greyscale_and_solarize_by_hand():
  rng = np.random.default_rng(8)
  image = rng.uniform(0, 1, (5, 6, 3)).astype(np.float32)
  grey = 0.299 * image[..., 0] + 0.587 * image[..., 1] + 0.114 * image[..., 2]
  np.testing.assert_allclose(crops.greyscale(image),
                             np.stack([grey] * 3, -1), atol=1e-6)
  image[0, 0] = [0.5, 0.49, 0.51]
  np.testing.assert_allclose(crops.solarize(image),
                             np.where(image >= 0.5, 1 - image, image))
  np.testing.assert_allclose(crops.solarize(image)[0, 0], [0.5, 0.49, 0.49],
                             atol=1e-6)


def test_brightness_contrast_saturation_by_hand():
  image = np.random.default_rng(9).uniform(0, 1, (5, 6, 3)).astype(
      np.float32)
  grey = image @ np.array([0.299, 0.587, 0.114], np.float32)
  for factor in (0.6, 1.4):
    np.testing.assert_allclose(crops.brightness(image, factor),
                               np.clip(image * factor, 0, 1), atol=1e-6)
    np.testing.assert_allclose(
        crops.contrast(image, factor),
        np.clip(factor * image + (1 - factor) * grey.mean(), 0, 1),
        atol=1e-6)
    np.testing.assert_allclose(
        crops.saturation(image, factor),
        np.clip(factor * image + (1 - factor) * grey[..., None], 0, 1),
        atol=1e-6)


def test_hue_against_colorsys():
  red = np.array([[[1.0, 0.0, 0.0]]], np.float32)
  np.testing.assert_allclose(crops.hue(red, 1 / 3), [[[0.0, 1.0, 0.0]]],
                             atol=1e-6)
  np.testing.assert_allclose(crops.hue(red, -1 / 3), [[[0.0, 0.0, 1.0]]],
                             atol=1e-6)
  image = np.random.default_rng(10).uniform(0, 1, (4, 5, 3)).astype(
      np.float32)
  image[0, 0] = [0.3, 0.3, 0.3]  # Grey stays grey.
  image[0, 1] = [0.8, 0.8, 0.2]  # Two channels tie.
  for shift in (-0.1, 0.07, 0.45):
    expected = np.array([
        colorsys.hsv_to_rgb((h + shift) % 1, s, v)
        for h, s, v in (colorsys.rgb_to_hsv(*pixel)
                        for pixel in image.reshape(-1, 3).astype(float))])
    np.testing.assert_allclose(crops.hue(image, shift),
                               expected.reshape(image.shape), atol=1e-5)


def test_hue_after_a_blend_compiled_for_a_batch():
  """Compiled, XLA may compute a blend twice for two consumers, rounding
  each its own way; the hue must not rely on the max equalling a channel
  (it did, and turned some pixels' hue by a third of a turn)."""
  image = np.random.default_rng(15).uniform(0, 1, (8, 4, 4, 3)).astype(
      np.float32)
  factors = np.linspace(0.6, 1.4, 8).astype(np.float32)
  for blend in (crops.contrast, crops.saturation):
    ours = jax.jit(jax.vmap(lambda x, f, blend=blend: crops.hue(
        blend(x, f), 0.05)))(image, factors)
    blended = np.asarray(jax.vmap(blend)(image, factors), np.float64)
    expected = np.array([
        colorsys.hsv_to_rgb((h + 0.05) % 1, s, v)
        for h, s, v in (colorsys.rgb_to_hsv(*pixel)
                        for pixel in blended.reshape(-1, 3))])
    np.testing.assert_allclose(ours, expected.reshape(image.shape),
                               atol=1e-5)


def test_blur_keeps_a_constant_and_spreads_a_point_as_a_gaussian():
  np.testing.assert_allclose(
      crops.blur(jnp.full((6, 6, 3), 0.3), 1.7), 0.3, atol=1e-6)
  point = np.zeros((17, 17, 1), np.float32)
  point[8, 8] = 1
  sigma = 1.3
  offsets = np.arange(-4, 5)
  gauss = np.exp(-offsets**2 / (2 * sigma**2))
  gauss /= gauss.sum()
  expected = np.zeros((17, 17))
  expected[4:13, 4:13] = np.outer(gauss, gauss)
  np.testing.assert_allclose(crops.blur(point, sigma)[..., 0], expected,
                             atol=1e-6)


def test_greyscale_applies_at_its_probability():
  # A crop is grey (its channels equal) only where greyscale applied:
  # jitter turns no colourful pixel grey.
  images = random_images(11, 8)
  always, _ = multi_crop(images, jax.random.key(12),
                         dataclasses.replace(SMALL, grey_prob=1.0))
  np.testing.assert_allclose(always[..., 0], always[..., 1], atol=1e-6)
  global_crops, local_crops = multi_crop(images, jax.random.key(12), SMALL)
  grey = np.concatenate([
      np.all(np.abs(x[..., 0] - x[..., 1]) < 1e-6, axis=(2, 3))
      for x in (global_crops, local_crops)], axis=1)
  # 40 crops: 8 grey expected, 2.5 the standard deviation.
  assert abs(grey.mean() - crops.GREY_PROB) < 0.15, grey.mean()


def test_sharded_over_eight_devices_as_on_one():
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
  rows = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("batch"))
  images = random_images(13, 8)
  key = jax.random.key(14)
  whole = multi_crop(images, key, SMALL)
  sharded = multi_crop(jax.device_put(images, rows), key, SMALL)
  assert len(sharded[0].sharding.device_set) == 8
  # The same draws; not bitwise: a device's resize contracts a batch of 1
  # row where one device's contracts 8, and XLA's kernels for the two
  # shapes round differently (a few float32 ulps). Another draw would move
  # pixels by far more.
  for x, y in zip(whole, sharded):
    np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)
