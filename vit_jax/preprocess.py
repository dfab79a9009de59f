"""Image ops on single examples, for tf.data `map` functions.

Images go in as the encoded PNG/JPEG bytes of a TFDS record and come out as
float32 RGB in [-1, 1] (x / 127.5 - 1, the scaling of the released
checkpoints). Training augmentations are stateless: each takes an explicit
seed, so an example's augmentation depends only on (run seed, example index)
and a resumed run sees the very pixels an uninterrupted one would have.

Augmentations, named in a config as a tuple or a comma-separated string and
applied in the order given, to the decoded image, before the final resize:
  flip            random left-right flip.
  shift           random translation by up to ceil(side / 8) pixels along
                  each axis (1 on 8x8 digits, 4 on 32x32 CIFAR), filling the
                  uncovered border with black (-1).
  inception_crop  random crop of 5%-100% of the area with aspect ratio in
                  [3/4, 4/3], as in ImageNet training; the resize that follows
                  brings it to the model's image size.
"""

import tensorflow as tf

SHIFT_DIVISOR = 8  # "shift" moves by at most ceil(side / SHIFT_DIVISOR).
INCEPTION_AREA_RANGE = (0.05, 1.0)
INCEPTION_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)


def decode(encoded):
  """PNG/JPEG bytes -> float32 [h, w, 3] in [-1, 1]; grayscale becomes RGB."""
  image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
  return tf.cast(image, tf.float32) / 127.5 - 1


def resize(image, image_size):
  """Bilinear resize to [image_size, image_size, 3] unless already that size."""
  already_sized = tf.reduce_all(tf.shape(image)[:2] == image_size)
  image = tf.cond(
      already_sized, lambda: image,
      lambda: tf.image.resize(image, (image_size, image_size)))
  return tf.ensure_shape(image, (image_size, image_size, 3))


def flip(image, seed):
  return tf.image.stateless_random_flip_left_right(image, seed)


def shift(image, seed):
  shape = tf.shape(image)
  pad = -(-shape[:2] // SHIFT_DIVISOR)  # Ceiling division.
  padded = tf.pad(image, [[pad[0], pad[0]], [pad[1], pad[1]], [0, 0]],
                  constant_values=-1.0)
  return tf.image.stateless_random_crop(padded, shape, seed)


def inception_crop(image, seed):
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image),
      bounding_boxes=tf.zeros([1, 0, 4]),  # None: crop from the whole image.
      seed=seed,
      min_object_covered=0.0,
      aspect_ratio_range=INCEPTION_ASPECT_RATIO_RANGE,
      area_range=INCEPTION_AREA_RANGE,
      use_image_if_no_bounding_boxes=True)
  return tf.slice(image, begin, size)


AUGMENTATIONS = {
    "flip": flip,
    "shift": shift,
    "inception_crop": inception_crop,
}


def parse_augmentations(augment):
  """("flip", "shift") or "flip,shift" (or empty) -> tuple of checked names."""
  if isinstance(augment, str):
    augment = augment.split(",")
  names = tuple(name.strip() for name in augment if name.strip())
  for name in names:
    if name not in AUGMENTATIONS:
      raise ValueError(f"unknown augmentation {name!r}: expected names from "
                       f"{sorted(AUGMENTATIONS)}")
  return names


def augment_image(image, names, seed):
  """Applies the named augmentations in order; seed: int [2], one per example.

  Each augmentation gets its own seed split off `seed`: reusing one seed would
  correlate their draws (e.g. every flipped image also shifted the same way).
  """
  seeds = tf.random.experimental.stateless_split(seed, num=len(names))
  for i, name in enumerate(names):
    image = AUGMENTATIONS[name](image, seeds[i])
  return image
