"""RandAugment (Cubuk et al. 2020), stateless, for tf.data `map` functions.

RandAugment applies `num_layers` image ops in a row, each drawn uniformly from
the 16 in `OPS` and applied at one fixed `magnitude` in [0, 10]. The ops and
their magnitude -> argument maps are those of the TensorFlow TPU reference
(tensorflow/tpu, models/official/efficientnet/autoaugment.py,
`distort_image_with_randaugment`), which big_vision uses (randaug(2, 10) in
"Better plain ViT baselines"); translate and cutout scale with the image's
size. docs/randaugment.md tabulates the ops and says where they differ from
the reference.

Images are uint8 [h, w, 3] of any size. Every random draw (the op of each
layer, a sign, a cutout's centre) is stateless and comes from a seed split off
the example's seed, so an example's pixels depend only on that seed: a
resumed run sees the very pixels an uninterrupted one would have.
"""

import numpy as np

from vit_jax import errors
from vit_jax.data.lazy_tensorflow import tf

MAX_MAGNITUDE = 10  # The reference's _MAX_LEVEL: magnitudes are in [0, 10].
# The reference fills pixels that rotate, shear, translate and cutout uncover
# with 128 in each channel (replace_value in distort_image_with_randaugment).
REPLACE_VALUE = 128
# Translate and cutout sizes as a fraction of the image's side: the reference
# moves by up to translate_const = 100 and cuts a square of up to
# 2 * cutout_const = 2 * 40 pixels, both set for 224 px images.
TRANSLATE_FRACTION = 100 / 224
CUTOUT_FRACTION = 40 / 224
# Degrees of rotation, shear factor and enhance factor at MAX_MAGNITUDE
# (_rotate_level_to_arg, _shear_level_to_arg, _enhance_level_to_arg).
MAX_ROTATE_DEGREES = 30
MAX_SHEAR = 0.3
ENHANCE_SCALE, ENHANCE_OFFSET = 1.8, 0.1  # factor = level * 1.8 + 0.1.
# Posterize keeps int(level * 4) bits, solarize's threshold is
# int(level * 256) and solarize_add adds int(level * 110) below 128.
MAX_POSTERIZE_BITS = 4
MAX_SOLARIZE_THRESHOLD = 256
MAX_SOLARIZE_ADD = 110
SOLARIZE_ADD_THRESHOLD = 128


def _level(magnitude):
  return magnitude / MAX_MAGNITUDE


def _random_sign(value, seed):
  """value or -value, each with probability 1/2."""
  value = tf.convert_to_tensor(value, tf.float32)
  negate = tf.random.stateless_uniform([], seed) < 0.5
  return tf.where(negate, -value, value)


def _blend(degenerate, image, factor):
  """degenerate + factor * (image - degenerate), rounded to uint8.

  factor 0 gives the degenerate image, 1 the image; above 1 extrapolates.
  degenerate: float32, a scalar or broadcast against the image.
  """
  # As factor * image + (1 - factor) * degenerate: one broadcast, not two.
  blended = factor * tf.cast(image, tf.float32) + (1 - factor) * degenerate
  return _round_to_uint8(blended)


def _round_to_uint8(pixels):
  return tf.cast(tf.round(tf.clip_by_value(pixels, 0.0, 255.0)), tf.uint8)


def _paste(image, patch, top, left):
  """image with `patch`, which fits inside it, over its pixels from (top, left).

  Slices and concatenations: tf.where over a whole image costs several times
  as much.
  """
  height, width = tf.shape(patch)[0], tf.shape(patch)[1]
  rows = image[top:top + height]
  middle = tf.concat([rows[:, :left], patch, rows[:, left + width:]], axis=1)
  pasted = tf.concat([image[:top], middle, image[top + height:]], axis=0)
  return tf.ensure_shape(pasted, image.shape)


def _enhance_factor(magnitude):
  return _level(magnitude) * ENHANCE_SCALE + ENHANCE_OFFSET


def _transform(image, transform):
  """Projective transform of a uint8 image, nearest, filled with 128.

  transform: 8 floats [a0, a1, a2, b0, b1, b2, c0, c1] mapping an output pixel
  (x, y) to the input pixel (a0 x + a1 y + a2, b0 x + b1 y + b2) (c0 = c1 = 0
  here); no interpolation, so pixel values are copied exactly.
  """
  transform = tf.reshape(tf.cast(tf.stack(transform), tf.float32), [1, 8])
  transformed = tf.raw_ops.ImageProjectiveTransformV3(
      images=image[tf.newaxis],
      transforms=transform,
      output_shape=tf.shape(image)[:2],
      fill_value=float(REPLACE_VALUE),
      interpolation="NEAREST",
      fill_mode="CONSTANT")
  return tf.ensure_shape(transformed[0], image.shape)


def _auto_contrast(image, magnitude, seed):
  """Stretches each channel's [min, max] to [0, 255]; flat channels stay."""
  del magnitude, seed
  low = tf.cast(tf.reduce_min(image, axis=[0, 1]), tf.float32)
  high = tf.cast(tf.reduce_max(image, axis=[0, 1]), tf.float32)
  stretch = high > low
  # A flat channel gets offset 0 and scale 1: unchanged.
  offset = tf.where(stretch, low, 0.0)
  scale = tf.where(stretch, 255.0 / tf.maximum(high - low, 1.0), 1.0)
  return _round_to_uint8((tf.cast(image, tf.float32) - offset) * scale)


def _equalize(image, magnitude, seed):
  """Per-channel histogram equalisation, PIL ImageOps.equalize's algorithm."""
  del magnitude, seed
  pixels = tf.reshape(tf.cast(image, tf.int32), [-1, 3])
  # Channel c counts into bins 256 c ... 256 c + 255: one bincount for all.
  bins = pixels + tf.range(3) * 256
  histogram = tf.reshape(
      tf.math.bincount(bins, minlength=768, maxlength=768), [3, 256])
  # The last nonzero bin of a channel is that of its largest value.
  last_count = tf.gather(histogram, tf.reduce_max(pixels, axis=0),
                         batch_dims=1)
  step = (tf.shape(pixels)[0] - last_count) // 255
  below = tf.cumsum(histogram, axis=1, exclusive=True)
  lut = (below + step[:, tf.newaxis] // 2) // tf.maximum(step, 1)[:, tf.newaxis]
  # step 0 (one value, or all but a few pixels in the top bin): unchanged.
  lut = tf.where(step[:, tf.newaxis] > 0, tf.minimum(lut, 255), tf.range(256))
  equalized = tf.gather(tf.reshape(lut, [-1]), bins)
  return tf.reshape(tf.cast(equalized, tf.uint8), tf.shape(image))


def _invert(image, magnitude, seed):
  del magnitude, seed
  return tf.constant(255, tf.uint8) - image


def _rotate(image, magnitude, seed):
  """Rotates by +-level * 30 degrees about the centre."""
  radians = _random_sign(_level(magnitude) * MAX_ROTATE_DEGREES * np.pi / 180,
                         seed)
  size = tf.cast(tf.shape(image)[:2], tf.float32)
  height, width = size[0] - 1, size[1] - 1
  cos, sin = tf.cos(radians), tf.sin(radians)
  # The offsets map the centre ((w - 1) / 2, (h - 1) / 2) onto itself.
  x_offset = (width - (cos * width - sin * height)) / 2
  y_offset = (height - (sin * width + cos * height)) / 2
  return _transform(image, [cos, -sin, x_offset, sin, cos, y_offset, 0., 0.])


def _posterize(image, magnitude, seed):
  """Keeps the top int(level * 4) bits, but see below for 0 bits.

  The reference shifts right then left by 8 - bits, and TensorFlow clamps a
  uint8 shift to 7: at 0 bits (magnitudes below 2.5) the top bit stays,
  rather than a black image. Reproduced here.
  """
  del seed
  bits = int(_level(magnitude) * MAX_POSTERIZE_BITS)
  dropped = min(8 - bits, 7)
  kept = tf.constant(255 >> dropped << dropped, tf.uint8)
  return tf.bitwise.bitwise_and(image, kept)


def _solarize(image, magnitude, seed):
  """x below int(level * 256), else 255 - x.

  At magnitude 10 the threshold is 256 and no pixel changes, as in the
  reference.
  """
  del seed
  threshold = int(_level(magnitude) * MAX_SOLARIZE_THRESHOLD)
  if threshold > 255:
    return image
  # 255 - x flips every bit of x; arithmetic is faster than tf.where here.
  flip = tf.cast(image >= tf.constant(threshold, tf.uint8), tf.uint8) * 255
  return tf.bitwise.bitwise_xor(image, flip)


def _solarize_add(image, magnitude, seed):
  """Adds int(level * 110) to pixels below 128."""
  del seed
  addition = int(_level(magnitude) * MAX_SOLARIZE_ADD)
  # Pixels below 128 plus at most 110 stay below 255: nothing to saturate.
  below = tf.cast(image < SOLARIZE_ADD_THRESHOLD, tf.uint8)
  return image + below * addition


def _color(image, magnitude, seed):
  """Blends with the grayscale image by level * 1.8 + 0.1 (1: unchanged)."""
  del seed
  gray = tf.image.rgb_to_grayscale(tf.cast(image, tf.float32))
  return _blend(gray, image, _enhance_factor(magnitude))


def _contrast(image, magnitude, seed):
  """Blends with the mean gray level by level * 1.8 + 0.1 (1: unchanged)."""
  del seed
  mean = tf.reduce_mean(tf.image.rgb_to_grayscale(tf.cast(image, tf.float32)))
  return _blend(mean, image, _enhance_factor(magnitude))


def _brightness(image, magnitude, seed):
  """Blends with black by level * 1.8 + 0.1 (1: unchanged)."""
  del seed
  return _blend(0.0, image, _enhance_factor(magnitude))


def _sharpness(image, magnitude, seed):
  """Blends with a smoothed image by level * 1.8 + 0.1 (1: unchanged).

  The smoothing kernel is [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13; the
  one-pixel border keeps its pixels, as the reference's VALID convolution
  leaves it.
  """
  del seed
  kernel = tf.constant([[1., 1., 1.], [1., 5., 1.], [1., 1., 1.]]) / 13
  kernel = tf.tile(kernel[:, :, tf.newaxis, tf.newaxis], [1, 1, 3, 1])
  # SAME's inner pixels are VALID's, and SAME works below 3x3 too.
  smoothed = tf.nn.depthwise_conv2d(
      tf.cast(image, tf.float32)[tf.newaxis], kernel, strides=[1, 1, 1, 1],
      padding="SAME")[0, 1:-1, 1:-1]
  # The border blends the image with itself: it stays as it is.
  inner = _blend(smoothed, image[1:-1, 1:-1], _enhance_factor(magnitude))
  return _paste(image, inner, 1, 1)


def _shear_x(image, magnitude, seed):
  """Shears by +-level * 0.3: row y moves by shear * y pixels along x."""
  shear = _random_sign(_level(magnitude) * MAX_SHEAR, seed)
  return _transform(image, [1., shear, 0., 0., 1., 0., 0., 0.])


def _shear_y(image, magnitude, seed):
  """Shears by +-level * 0.3: column x moves by shear * x pixels along y."""
  shear = _random_sign(_level(magnitude) * MAX_SHEAR, seed)
  return _transform(image, [1., 0., 0., shear, 1., 0., 0., 0.])


def _translate(image, magnitude, seed, axis):
  """Moves by +-round(level * 100 / 224 * side) pixels along axis (0: y).

  Whole pixels, so a pad and a slice give the projective transform's pixels,
  several times faster.
  """
  side = tf.shape(image)[axis]
  pixels = tf.round(_level(magnitude) * TRANSLATE_FRACTION *
                    tf.cast(side, tf.float32))
  shift = tf.cast(_random_sign(pixels, seed), tf.int32)
  before, after = tf.maximum(shift, 0), tf.maximum(-shift, 0)
  paddings, begin, size = [[0, 0]] * 3, [0] * 3, [-1] * 3
  paddings[axis], begin[axis], size[axis] = [before, after], after, side
  padded = tf.pad(image, paddings, constant_values=REPLACE_VALUE)
  return tf.ensure_shape(tf.slice(padded, begin, size), image.shape)


def _translate_x(image, magnitude, seed):
  """Moves right or left by round(level * 100 / 224 * width) pixels."""
  return _translate(image, magnitude, seed, axis=1)


def _translate_y(image, magnitude, seed):
  """Moves down or up by round(level * 100 / 224 * height) pixels."""
  return _translate(image, magnitude, seed, axis=0)


def _cutout(image, magnitude, seed):
  """Fills a square of side 2 * pad with 128, centred at a random pixel.

  pad = round(level * 40 / 224 * min(h, w)); the square is clipped to the
  image.
  """
  shape = tf.shape(image)
  pad = tf.cast(tf.round(_level(magnitude) * CUTOUT_FRACTION *
                         tf.cast(tf.reduce_min(shape[:2]), tf.float32)),
                tf.int32)
  row_seed, column_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 2))
  row = tf.random.stateless_uniform([], row_seed, maxval=shape[0],
                                    dtype=tf.int32)
  column = tf.random.stateless_uniform([], column_seed, maxval=shape[1],
                                       dtype=tf.int32)
  top, left = tf.maximum(row - pad, 0), tf.maximum(column - pad, 0)
  bottom = tf.minimum(row + pad, shape[0])
  right = tf.minimum(column + pad, shape[1])
  patch = tf.fill([bottom - top, right - left, 3],
                  tf.constant(REPLACE_VALUE, tf.uint8))
  return _paste(image, patch, top, left)


# name -> function(image, magnitude, seed) -> image, in the reference's order
# (its available_ops), which the drawn op indices refer to.
OPS = {
    "AutoContrast": _auto_contrast,
    "Equalize": _equalize,
    "Invert": _invert,
    "Rotate": _rotate,
    "Posterize": _posterize,
    "Solarize": _solarize,
    "Color": _color,
    "Contrast": _contrast,
    "Brightness": _brightness,
    "Sharpness": _sharpness,
    "ShearX": _shear_x,
    "ShearY": _shear_y,
    "TranslateX": _translate_x,
    "TranslateY": _translate_y,
    "Cutout": _cutout,
    "SolarizeAdd": _solarize_add,
}


def check(num_layers, magnitude):
  """errors.InputError unless num_layers >= 0 and 0 <= magnitude <= 10."""
  if (isinstance(num_layers, bool) or
      not isinstance(num_layers, (int, np.integer)) or num_layers < 0):
    raise errors.InputError(
        f"its number of layers must be a whole number >= 0, got "
        f"{num_layers!r}", key="randaugment")
  if (isinstance(magnitude, bool) or
      not isinstance(magnitude, (int, float, np.integer, np.floating)) or
      not 0 <= magnitude <= MAX_MAGNITUDE):  # Also refuses NaN.
    raise errors.InputError(
        f"its magnitude must be a number in [0, {MAX_MAGNITUDE}], got "
        f"{magnitude!r}", key="randaugment")


def _layer_seeds(seed, num_layers):
  """[num_layers, 2, 2]: per layer, the seed that picks its op, the op's."""
  seeds = tf.random.experimental.stateless_split(seed, 2 * num_layers)
  return tf.reshape(seeds, [num_layers, 2, 2])


def _choose(layer_seeds):
  return tf.stack([
      tf.random.stateless_uniform([], layer_seed[0], maxval=len(OPS),
                                  dtype=tf.int32)
      for layer_seed in tf.unstack(layer_seeds)])


def chosen_ops(seed, num_layers):
  """int32 [num_layers]: the indices into OPS that randaugment applies."""
  check(num_layers, 0)
  if not num_layers:
    return tf.zeros([0], tf.int32)
  return _choose(_layer_seeds(seed, num_layers))


def randaugment(image, seed, num_layers, magnitude):
  """num_layers ops drawn from OPS, each at `magnitude`; seed: int [2].

  Each layer's op and its draws come from seeds split off `seed`. Only the
  drawn op runs (a switch, not one conditional per op).
  """
  check(num_layers, magnitude)
  if not num_layers:
    return image
  layer_seeds = _layer_seeds(seed, num_layers)
  choices = _choose(layer_seeds)
  for layer in range(num_layers):
    image = _apply(image, choices[layer], magnitude, layer_seeds[layer, 1])
  return image


def _apply(image, index, magnitude, seed):
  branches = [lambda op=op: op(image, magnitude, seed) for op in OPS.values()]
  return tf.ensure_shape(tf.switch_case(index, branches), image.shape)
