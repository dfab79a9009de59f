"""The `digits` TFDS dataset: scikit-learn's 8x8 handwritten digits.

The data ships inside scikit-learn, so the dataset is prepared offline in
seconds; it is the project's default job and what the tests train on.
"""

import collections

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

IMAGE_SIZE = 8
NUM_TEST_EXAMPLES = 360
SKLEARN_MAX_VALUE = 16  # Pixels count the set bits of 4x4 cells.


def to_uint8(pixels):
  """0..16 pixel values -> 0..255, rounded; distinct values stay distinct."""
  return np.round(pixels * (255 / SKLEARN_MAX_VALUE)).astype(np.uint8)


def split_indices(labels):
  """Fixed stratified (train, test) indices into `load_digits()`."""
  # scikit-learn is slow to import (docs/speed_on_cpu.md): imported only
  # when digits is prepared, not in every tool that looks the dataset up.
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  return model_selection.train_test_split(
      np.arange(len(labels)), test_size=NUM_TEST_EXAMPLES, stratify=labels,
      random_state=0)


# digits/mixed_sizes: each image's longer side and aspect ratio.
MIXED_LONG_SIDES = (8, 16)  # pixels, both included
MIXED_MAX_ASPECT = 3.0  # from 1:3 to 3:1


class DigitsConfig(tfds.core.BuilderConfig):
  """Which digits a variant holds; they are relabelled 0, 1, ... in order.
  `mixed_sizes`: each image resized to a size of its own (`mixed_size`).
  `train_per_class`: the training split holds only the first this many
  of each class (in the fixed split's order); 0: all."""

  def __init__(self, *, digits, mixed_sizes=False, train_per_class=0,
               **kwargs):
    super().__init__(version="1.0.0", **kwargs)
    self.digits = tuple(digits)
    self.mixed_sizes = mixed_sizes
    self.train_per_class = train_per_class


def first_of_each(indices, labels, count):
  """The `indices` whose label is among the first `count` of its class, in
  order."""
  seen, kept = collections.Counter(), []
  for index in indices:
    seen[labels[index]] += 1
    if seen[labels[index]] <= count:
      kept.append(index)
  return kept


def mixed_size(index, long_sides=MIXED_LONG_SIDES):
  """(height, width) of image `index` of digits/mixed_sizes: the longer
  side uniform over `long_sides` (both included; benchmarks/naflex.py
  writes other ranges), the aspect ratio log-uniform up to
  MIXED_MAX_ASPECT either way, both drawn from the index alone."""
  rng = np.random.default_rng(index)
  longer = int(rng.integers(long_sides[0], long_sides[1] + 1))
  aspect = float(np.exp(rng.uniform(-1, 1) * np.log(MIXED_MAX_ASPECT)))
  shorter = max(1, round(longer / max(aspect, 1 / aspect)))
  return (longer, shorter) if aspect >= 1 else (shorter, longer)


def resized(image, size):
  """A uint8 [8, 8, 1] digit bilinearly resized to `size`, uint8."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.saturate_cast(tf.round(tf.image.resize(
      image.astype(np.float32), size, antialias=True)), tf.uint8).numpy()


class Digits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """1,797 grayscale 8x8 digits, 10 classes; 1,437 train / 360 test.

  `digits` (= `digits/all`) holds them all; `digits/0to4` and `digits/5to9`
  hold halves, with the same train/test assignment, for transfer
  experiments (configs/digits_transfer.py); `digits/mixed_sizes` all of
  them at sizes of their own (configs/packed_digits.py);
  `digits/10_per_class` 10 training images of each digit and the whole
  test split, for learning from few labels (configs/mae/digits.py).
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {
      "1.0.0": "sklearn load_digits, pixels scaled to uint8, fixed stratified "
               "360-example test split (random_state=0).",
  }
  BUILDER_CONFIGS = [
      DigitsConfig(name="all", digits=range(10), description="All digits."),
      DigitsConfig(name="0to4", digits=range(5),
                   description="Digits 0-4, labels 0-4."),
      DigitsConfig(name="5to9", digits=range(5, 10),
                   description="Digits 5-9, labels 0-4."),
      DigitsConfig(name="mixed_sizes", digits=range(10), mixed_sizes=True,
                   description="All digits, each resized to a size of its "
                   "own: the longer side 8-16 pixels, aspect ratios 1:3 to "
                   "3:1 (NaFlex and packing, docs/naflex.md)."),
      DigitsConfig(name="10_per_class", digits=range(10), train_per_class=10,
                   description="All digits; the training split holds the "
                   "first 10 of each (100), the test split all 360."),
  ]

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    # TFDS's default finds this file through `importlib_resources`, which TFDS
    # only depends on for Python < 3.9, and fails where it is not installed.
    return epath.Path(__file__)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description=(
            "Optical recognition of handwritten digits (UCI), as shipped by "
            "scikit-learn: 8x8 grayscale images of the digits 0-9."),
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(
                shape=((None, None, 1) if self.builder_config.mixed_sizes
                       else (IMAGE_SIZE, IMAGE_SIZE, 1)), dtype=np.uint8),
            "label": tfds.features.ClassLabel(
                names=[str(d) for d in self.builder_config.digits]),
        }),
        supervised_keys=("image", "label"),
        homepage="https://scikit-learn.org/stable/modules/generated/"
                 "sklearn.datasets.load_digits.html",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the data comes with scikit-learn.
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
    digits = datasets.load_digits()
    train, test = split_indices(digits.target)
    if self.builder_config.train_per_class:
      train = first_of_each(train, digits.target,
                            self.builder_config.train_per_class)
    return {
        "train": self._generate_examples(digits, train),
        "test": self._generate_examples(digits, test),
    }

  def _generate_examples(self, digits, indices):
    kept = self.builder_config.digits
    for index in indices:
      if digits.target[index] not in kept:
        continue
      image = to_uint8(digits.images[index])[..., np.newaxis]
      if self.builder_config.mixed_sizes:
        image = resized(image, mixed_size(int(index)))
      # The index into load_digits() is a stable, unique key.
      yield int(index), {"image": image,
                         "label": kept.index(digits.target[index])}
