"""Image ops on single examples, for tf.data `map` functions.

Images go in as the encoded PNG/JPEG bytes of a TFDS record and come out as
uint8 RGB, whatever their size: grayscale is repeated into the three
channels, an alpha channel is dropped (the stored colour of transparent
pixels is kept, not composited onto a background) and 16-bit PNGs are scaled
to 8 bits. A resize rounds its result back to uint8. Batches of uint8 are a
quarter of float32's bytes for the host to write and send; the model scales
them to [-1, 1] (x / 127.5 - 1, as the released checkpoints expect) on the
device. Training augmentations are stateless: each takes an explicit
seed, so an example's augmentation depends only on (run seed, example index)
and a resumed run sees the very pixels an uninterrupted one would have.

Augmentations, named in a config as a tuple or a comma-separated string and
applied in the order given, to the decoded image, before the final resize:
  flip            random left-right flip.
  shift           random translation by up to ceil(side / 8) pixels along
                  each axis (1 on 8x8 digits, 4 on 32x32 CIFAR), filling the
                  uncovered border with black.
  inception_crop  random crop of 5%-100% of the area with aspect ratio in
                  [3/4, 4/3], as in ImageNet training; the resize that follows
                  brings it to the model's image size.
  mae_crop        the same of 20%-100% of the area: masked autoencoders'
                  pre-training crops (He et al. 2022).
  random_crop     the released fine-tuning recipe: resize to a square of
                  round(image_size * 7 / 6) (448 for 384), then a random
                  image_size x image_size crop, so the final resize is a no-op.
                  Usually followed by flip: "random_crop,flip".

RandAugment (config.randaugment "N,M", vit_jax/data/randaugment.py) comes
after them and after the final resize, at the model's resolution, as in
big_vision's recipe; it draws from a seed of its own folded off the
example's, so that turning it on leaves the other augmentations' draws as
they were.

Evaluation resizes to the image size, or with a crop fraction f < 1 resizes
to round(image_size / f) and takes the central image_size square (the
ImageNet-style f = 0.875: 256 -> 224); see `eval_resize`.

NaFlex (vit_jax/models/naflex.py) keeps each image's aspect ratio instead:
`naflex_patches` resizes it to the largest grid of patches within a budget
(antialiased, as SigLIP 2's processor resizes) and cuts it into patches.
"""

import dataclasses

import numpy as np

from vit_jax import errors
from vit_jax.data import randaugment as randaugment_lib
from vit_jax.data.lazy_tensorflow import tf
from vit_jax.models import naflex

SHIFT_DIVISOR = 8  # "shift" moves by at most ceil(side / SHIFT_DIVISOR).
INCEPTION_AREA_RANGE = (0.05, 1.0)
MAE_AREA_RANGE = (0.2, 1.0)
INCEPTION_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
# "random_crop" resizes to RANDOM_CROP_RESIZE_FACTOR * image_size, then crops.
RANDOM_CROP_RESIZE_FACTOR = 7 / 6  # 448 -> 384, as in the released recipe.


def decode(encoded):
  """PNG/JPEG bytes -> uint8 [h, w, 3].

  Grayscale becomes RGB and alpha is dropped (`channels=3`).
  """
  return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def resize(image, image_size):
  """Bilinear resize of a uint8 image to [image_size, image_size, 3], rounded
  to uint8, unless it is that size already."""
  already_sized = tf.reduce_all(tf.shape(image)[:2] == image_size)
  image = tf.cond(already_sized, lambda: image,
                  lambda: _resized(image, image_size))
  return tf.ensure_shape(image, (image_size, image_size, 3))


def _resized(image, image_size):
  # TensorFlow's bilinear kernel is faster on float32 than on uint8 input.
  resized = tf.image.resize(tf.cast(image, tf.float32),
                            (image_size, image_size))
  return tf.saturate_cast(tf.round(resized), tf.uint8)


def naflex_patches(image, patch_size, max_num_patches, fill=True,
                   scale=1.0):
  """(pixels [max_num_patches, p * p * 3] uint8, grid [2] int32) of a uint8
  image at its NaFlex grid: the largest within the budget (naflex.grid_for)
  where `fill`, else its own size times `scale` (a float32 scalar tensor),
  shrunk only to fit (naflex.native_grid, a packed run's). Resized
  bilinearly with antialiasing unless it is that size already, cut into
  patches row by row, each flattened as (row, column, channel), and padded
  with zeros."""
  shape = tf.shape(image)

  def grid_of(height, width, factor):
    if fill:
      grid = naflex.grid_for(int(height), int(width), patch_size,
                             max_num_patches)
    else:
      grid = naflex.native_grid(int(height), int(width), patch_size,
                                max_num_patches, float(factor))
    return np.array(grid, np.int32)

  grid = tf.numpy_function(grid_of, [shape[0], shape[1], tf.cast(
      scale, tf.float32)], tf.int32, stateful=False)
  grid = tf.ensure_shape(grid, (2,))
  size = grid * patch_size
  image = tf.cond(
      tf.reduce_all(shape[:2] == size), lambda: image,
      lambda: tf.saturate_cast(tf.round(tf.image.resize(
          tf.cast(image, tf.float32), size, antialias=True)), tf.uint8))
  patches = tf.reshape(image, (grid[0], patch_size, grid[1], patch_size, 3))
  patches = tf.reshape(tf.transpose(patches, (0, 2, 1, 3, 4)),
                       (-1, patch_size * patch_size * 3))
  pixels = tf.pad(patches, [[0, max_num_patches - tf.shape(patches)[0]],
                            [0, 0]])
  return tf.ensure_shape(pixels, (max_num_patches, patch_size ** 2 * 3)), grid


def sampled_scale(image, min_side, max_side, seed):
  """The factor that resizes `image`, keeping its aspect ratio, to an area
  of s x s pixels, s drawn uniformly from [min_side, max_side] by `seed`
  (resolution sampling, as NaViT trains)."""
  side = tf.random.stateless_uniform([], seed, float(min_side),
                                     float(max_side) + 1e-6)
  area = tf.cast(tf.reduce_prod(tf.shape(image)[:2]), tf.float32)
  return side / tf.sqrt(area)


def grid_positions(grid, length):
  """[length, 2] int32: each of the first grid[0] * grid[1] patches' (row,
  col) in `grid`, row by row; zeros after."""
  index = tf.range(length)
  positions = tf.stack([index // grid[1], index % grid[1]], axis=-1)
  return tf.where((index < grid[0] * grid[1])[:, None], positions, 0)


def drop_patches(pixels, grid, rate, seed):
  """(pixels, positions [L, 2] int32, tokens int32) of an image's NaFlex
  `pixels` [L, ...] at `grid`: a random share `rate` (a scalar tensor) of
  its rows * cols patches left out (at least one kept), the kept ones first
  in their order, each with its (row, col) in the grid; `tokens` of them.
  The rest of `pixels` and `positions` is zeros."""
  length = pixels.shape[0]
  count = grid[0] * grid[1]
  drop = tf.cast(tf.floor(rate * tf.cast(count, tf.float32)), tf.int32)
  tokens = tf.maximum(count - drop, 1)
  index = tf.range(length)
  noise = tf.where(index < count,
                   tf.random.stateless_uniform([length], seed), 2.0)
  rank = tf.math.invert_permutation(tf.argsort(noise))
  kept = rank < tokens
  order = tf.argsort(tf.where(kept, index, length + index))
  positions = tf.stack([order // grid[1], order % grid[1]], axis=-1)
  real = (tf.range(length) < tokens)[:, None]
  return (tf.where(real, tf.gather(pixels, order), 0),
          tf.where(real, positions, 0), tokens)


def central_crop(image, image_size):
  """The central [image_size, image_size] of an image at least that large.

  An odd margin leaves its extra pixel at the bottom / right.
  """
  shape = tf.shape(image)
  top = (shape[0] - image_size) // 2
  left = (shape[1] - image_size) // 2
  image = image[top:top + image_size, left:left + image_size]
  return tf.ensure_shape(image, (image_size, image_size, 3))


def check_crop_fraction(crop_fraction):
  if not 0 < crop_fraction <= 1:  # Also refuses NaN.
    raise errors.InputError(
        f"must be in (0, 1], got {crop_fraction!r}: 1 resizes to the image "
        "size, f < 1 resizes to image_size / f and takes the central crop",
        key="eval_crop_fraction")


def eval_resize(image, image_size, crop_fraction=1.0):
  """Evaluation's resize to [image_size, image_size, 3].

  crop_fraction 1: a plain (bilinear) resize. f < 1: resize to the square of
  round(image_size / f), then the central image_size square (0.875 on 224:
  256 then the central 224).
  """
  check_crop_fraction(crop_fraction)
  if crop_fraction == 1:
    return resize(image, image_size)
  larger = round(image_size / crop_fraction)
  return central_crop(resize(image, larger), image_size)


def flip(image, seed):
  return tf.image.stateless_random_flip_left_right(image, seed)


def shift(image, seed):
  shape = tf.shape(image)
  pad = -(-shape[:2] // SHIFT_DIVISOR)  # Ceiling division.
  padded = tf.pad(image, [[pad[0], pad[0]], [pad[1], pad[1]], [0, 0]])
  return tf.image.stateless_random_crop(padded, shape, seed)


def inception_crop(image, seed, area_range=INCEPTION_AREA_RANGE):
  begin, size = _inception_window(tf.shape(image), seed, area_range)
  return tf.slice(image, begin, size)


def mae_crop(image, seed):
  return inception_crop(image, seed, MAE_AREA_RANGE)


# The crops whose window a JPEG's header gives (decode_and_augment), by the
# share of the area they take.
AREA_CROPS = {"inception_crop": INCEPTION_AREA_RANGE,
              "mae_crop": MAE_AREA_RANGE}


def _inception_window(shape, seed, area_range=INCEPTION_AREA_RANGE):
  """(begin, size) of inception_crop: [top, left, 0], [height, width, -1].

  Depends on the image's height and width (shape[:2]) only.
  """
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape,
      bounding_boxes=tf.zeros([1, 0, 4]),  # None: crop from the whole image.
      seed=seed,
      min_object_covered=0.0,
      aspect_ratio_range=INCEPTION_ASPECT_RATIO_RANGE,
      area_range=area_range,
      use_image_if_no_bounding_boxes=True)
  return begin, size


# Pixels decoded around a JPEG crop on each side, then dropped. libjpeg
# rebuilds subsampled chroma (4:2:0, 4:2:2) from neighbouring samples and
# takes the edge of the decoded window for the image's, so a tight window's
# outer rows or columns differ from a full decode's; one chroma sample
# (2 pixels) more on each side makes them bitwise equal.
JPEG_CROP_MARGIN = 2


def decode_and_inception_crop(encoded, seed, area_range=INCEPTION_AREA_RANGE):
  """inception_crop(decode(encoded), seed), decoding only the crop of a JPEG.

  The crop window needs only the image's height and width, which a JPEG's
  header holds, so libjpeg decodes just that window (plus JPEG_CROP_MARGIN),
  not the whole image (docs/input_pipeline.md). The pixels equal those of a
  full decode and crop, bitwise (tests/test_input_pipeline.py). Other
  formats (PNG) are decoded whole, then cropped.
  """
  return tf.cond(tf.io.is_jpeg(encoded),
                 lambda: _decode_jpeg_window(encoded, seed, area_range),
                 lambda: inception_crop(decode(encoded), seed, area_range))


def _decode_jpeg_window(encoded, seed, area_range):
  shape = tf.io.extract_jpeg_shape(encoded)  # [height, width, channels]
  begin, size = _inception_window(shape, seed, area_range)
  start = tf.maximum(begin[:2] - JPEG_CROP_MARGIN, 0)
  end = tf.minimum(begin[:2] + size[:2] + JPEG_CROP_MARGIN, shape[:2])
  window = tf.io.decode_and_crop_jpeg(
      encoded, tf.concat([start, end - start], 0), channels=3)
  return tf.slice(window, tf.concat([begin[:2] - start, [0]], 0), size)


def random_crop(image, seed, image_size):
  """Resize to round(image_size * 7 / 6) square, random image_size crop."""
  larger = round(image_size * RANDOM_CROP_RESIZE_FACTOR)
  image = resize(image, larger)
  return tf.image.stateless_random_crop(image, (image_size, image_size, 3),
                                        seed)


def _ignoring_image_size(augmentation):
  return lambda image, seed, image_size: augmentation(image, seed)


# name -> function(image, seed, image_size) -> image.
AUGMENTATIONS = {
    "flip": _ignoring_image_size(flip),
    "shift": _ignoring_image_size(shift),
    "inception_crop": _ignoring_image_size(inception_crop),
    "mae_crop": _ignoring_image_size(mae_crop),
    "random_crop": random_crop,
}


@dataclasses.dataclass(frozen=True)
class Augmentation:
  """What training does to each image, parsed and checked once
  (`augmentation`): the named augmentations in order (AUGMENTATIONS), then
  RandAugment's `layers` ops at `magnitude` (0 layers: none)."""
  names: tuple = ()
  layers: int = 0
  magnitude: float = 0.0


def augmentation(augment="", randaugment=""):
  """The Augmentation of `augment` ("flip,shift", a tuple of names, or
  empty) and `randaugment` ("N,M", or "" for none); an InputError's key
  is the argument that is wrong."""
  if isinstance(augment, str):
    augment = augment.split(",")
  names = tuple(name.strip() for name in augment if name.strip())
  for name in names:
    if name not in AUGMENTATIONS:
      raise errors.InputError(
          f"unknown augmentation {name!r}: expected names from "
          f"{sorted(AUGMENTATIONS)}", key="augment")
  return Augmentation(names, *_parse_randaugment(randaugment))


def augment_image(image, names, seed, image_size, done=0):
  """Applies the named augmentations in order; seed: int [2], one per example.

  `image_size` is the model's resolution, which "random_crop" crops to. The
  first `done` augmentations were applied already (decode_and_augment crops
  while decoding); the rest keep their own seeds.

  Each augmentation gets its own seed split off `seed`: reusing one seed would
  correlate their draws (e.g. every flipped image also shifted the same way).
  """
  seeds = tf.random.experimental.stateless_split(seed, num=len(names))
  for i in range(done, len(names)):
    image = AUGMENTATIONS[names[i]](image, seeds[i], image_size)
  return image


def decode_and_augment(encoded, names, seed, image_size):
  """augment_image(decode(encoded), names, seed, image_size), the same pixels.

  When "inception_crop" or "mae_crop" comes first, only its crop of a JPEG
  is decoded (decode_and_inception_crop), with the seed augment_image would
  give it.
  """
  if not names or names[0] not in AREA_CROPS:
    return augment_image(decode(encoded), names, seed, image_size)
  crop_seed = tf.random.experimental.stateless_split(seed, num=len(names))[0]
  image = decode_and_inception_crop(encoded, crop_seed, AREA_CROPS[names[0]])
  return augment_image(image, names, seed, image_size, done=1)


# Folded into an example's seed for RandAugment's draws.
RANDAUGMENT_STREAM = 0x7261  # "ra"


def _parse_randaugment(spec):
  """"N,M" -> (N, M): N ops an image at magnitude M; "" -> (0, 0.0)."""
  if not spec:
    return 0, 0.0
  try:
    layers, magnitude = str(spec).split(",")
    layers, magnitude = int(layers), float(magnitude)
  except ValueError:
    raise errors.InputError(
        f"must be 'N,M' (N ops per image at magnitude M of "
        f"{randaugment_lib.MAX_MAGNITUDE:g}, e.g. '2,10'), or '' for none; "
        f"got {spec!r}", key="randaugment") from None
  randaugment_lib.check(layers, magnitude)
  return layers, magnitude


def randaugment(image, augmentation, seed):
  """RandAugment as `augmentation` (an Augmentation) says, with a seed
  folded off the example's `seed`; the image as it is for none."""
  if not augmentation.layers:
    return image
  seed = tf.random.experimental.stateless_fold_in(seed, RANDAUGMENT_STREAM)
  return randaugment_lib.randaugment(image, seed, augmentation.layers,
                                     augmentation.magnitude)
