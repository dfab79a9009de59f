"""Input pipeline: digits data, resumable streams, shares, padding, errors."""

import collections

import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from sklearn import datasets as sklearn_datasets, model_selection

from tests.util import stored_examples
from vit_jax import errors, sharding as sharding_lib
from vit_jax.data import (
  digits,
  pipeline as pipeline_lib,
  preprocess,
  shares as shares_lib,
  sources,
)


def take(dataset, num_batches):
  return list(dataset.take(num_batches).as_numpy_iterator())


def train_batches(data_dir, num_batches, augment="", **overrides):
  kwargs = dict(batch_size=32, image_size=8,
                augmentation=preprocess.augmentation(augment))
  kwargs.update(overrides)
  return take(pipeline_lib.train_dataset(sources.lookup("digits", data_dir),
                                         "train", **kwargs), num_batches)


def assert_same_batches(batches, expected):
  assert len(batches) == len(expected)
  for batch, expected_batch in zip(batches, expected):
    np.testing.assert_array_equal(batch["image"], expected_batch["image"])
    np.testing.assert_array_equal(batch["label"], expected_batch["label"])


def example_keys(pixels, labels):
  """Multiset of (0..16 pixels, label): identifies a digits example."""
  return collections.Counter(
      (np.asarray(p, np.uint8).tobytes(), int(label))
      for p, label in zip(pixels, labels))


def sklearn_keys(indices=None):
  data = sklearn_datasets.load_digits()
  indices = np.arange(len(data.target)) if indices is None else indices
  return example_keys(data.images[indices], data.target[indices])


def stored_keys(data_dir, split):
  """Keys of a split as TFDS stores it: uint8 pixels mapped back to 0..16."""
  examples = stored_examples(sources.get_builder("digits", data_dir), split)
  images = np.stack([preprocess.decode(e["image"]).numpy() for e in examples])
  assert images.dtype == np.uint8
  pixels = images[..., 0].astype(np.float64)  # uint8 * 16 overflows.
  return example_keys(np.round(pixels * 16 / 255),
                      np.array([e["label"] for e in examples]))


def pipeline_keys(batches):
  """Keys of the real (unmasked) examples in pipeline batches."""
  images = np.concatenate([b["image"] for b in batches])
  labels = np.concatenate([b["label"] for b in batches])
  if "mask" in batches[0]:
    real = np.concatenate([b["mask"] for b in batches]) == 1
    images, labels = images[real], labels[real]
  return example_keys(np.round(images[..., 0].astype(np.float64) * 16 / 255),
                      labels)


def test_digits_has_a_fixed_stratified_split(digits_data_dir):
  assert sources.lookup("digits", digits_data_dir).num_examples("train") == 1437
  assert sources.lookup("digits", digits_data_dir).num_examples("test") == 360
  assert sources.lookup("digits", digits_data_dir).num_classes == 10
  labels = sklearn_datasets.load_digits().target
  train, test = model_selection.train_test_split(
      np.arange(len(labels)), test_size=360, stratify=labels, random_state=0)

  test_keys = stored_keys(digits_data_dir, "test")
  assert stored_keys(digits_data_dir, "train") == sklearn_keys(train)
  assert test_keys == sklearn_keys(test)
  per_class = collections.Counter(label for _, label in test_keys)
  assert all(abs(per_class[label] - 36) <= 1 for label in range(10))


def test_digits_splits_are_disjoint_and_cover_sklearns_data(digits_data_dir):
  train = stored_keys(digits_data_dir, "train")
  test = stored_keys(digits_data_dir, "test")
  assert not set(train) & set(test)
  assert train + test == sklearn_keys()


def test_train_batches_are_rgb_images_in_range(digits_any_format):
  batch, = train_batches(digits_any_format, 1, augment=("shift", "flip"))
  image, label = batch["image"], batch["label"]
  # uint8, a quarter of float32's bytes; the model scales it to [-1, 1].
  assert image.shape == (32, 8, 8, 3) and image.dtype == np.uint8
  assert label.shape == (32,) and label.dtype == np.int32
  assert image.min() == 0 and image.max() == 255  # Digits' full range.
  assert ((label >= 0) & (label < 10)).all()
  # Grayscale is tiled to the 3 channels the released models expect.
  np.testing.assert_array_equal(image[..., 0], image[..., 2])


def test_same_seed_same_batches_other_seed_other_order(digits_any_format):
  first = train_batches(digits_any_format, 3, augment="shift,flip", seed=7)
  again = train_batches(digits_any_format, 3, augment="shift,flip", seed=7)
  other = train_batches(digits_any_format, 3, augment="shift,flip", seed=8)
  assert_same_batches(again, first)
  assert not np.array_equal(np.concatenate([b["label"] for b in other]),
                            np.concatenate([b["label"] for b in first]))


def test_every_epoch_is_a_new_permutation_of_the_split(digits_any_format):
  # 1437 = 3 * 479: each epoch is exactly three batches.
  batches = train_batches(digits_any_format, 6, batch_size=479)
  first_epoch, second_epoch = batches[:3], batches[3:]
  split = stored_keys(digits_any_format, "train")
  assert pipeline_keys(first_epoch) == split
  assert pipeline_keys(second_epoch) == split
  assert not np.array_equal(first_epoch[0]["label"], second_epoch[0]["label"])


def test_resumed_stream_continues_the_uninterrupted_one(digits_any_format):
  # 64-example batches: step 22 crosses into the second epoch.
  settings = dict(batch_size=64, augment=("shift", "flip"), seed=3)
  uninterrupted = train_batches(digits_any_format, 26, **settings)
  resumed = train_batches(digits_any_format, 6, start_step=20, **settings)
  assert_same_batches(resumed, uninterrupted[20:])


def test_shares_are_disjoint_and_cover_the_split(digits_any_format):
  # 1437 examples in 3 shares of 479: one block of 479 is one epoch of a share.
  shares = [
      pipeline_keys(train_batches(digits_any_format, 1, batch_size=3 * 479,
                                  shares=(share,), num_shares=3))
      for share in range(3)
  ]
  for a in range(3):
    for b in range(a + 1, 3):
      assert not set(shares[a]) & set(shares[b])
  assert shares[0] + shares[1] + shares[2] == stored_keys(digits_any_format,
                                                          "train")


def test_global_batches_do_not_depend_on_processes_or_devices(
    digits_any_format):
  """16 input shares read by 1 process of 8 devices, 2 of 4, 4 of 2, 1 of 4,
  2 of 2 and 4 of 1 make the same global batches, bit for bit, streamed or
  read at random, from a resumed step in a share's second epoch (from step
  1, a pod's losses equal one process's: tests/test_pod.py)."""
  settings = dict(batch_size=64, num_shares=16, augment="shift,flip", seed=5,
                  start_step=21)

  def global_batches(num_processes, devices):
    parts = []
    for process in range(num_processes):
      blocks = tuple(range(process * devices, (process + 1) * devices))
      shares = shares_lib.shares_of(blocks, num_processes * devices, 16)
      parts.append(train_batches(digits_any_format, 3, shares=shares,
                                 **settings))
    return [{key: np.concatenate([part[step][key] for part in parts])
             for key in ("image", "label", "index")} for step in range(3)]

  expected = global_batches(1, 8)
  for layout in ((2, 4), (4, 2), (1, 4), (2, 2), (4, 1)):
    got = global_batches(*layout)
    for batch, want in zip(got, expected):
      for key in want:
        np.testing.assert_array_equal(batch[key], want[key], err_msg=layout)


def records_read_before_first_batch(data_dir, start_step, monkeypatch):
  read = []
  real_records = pipeline_lib._ShareTable.records

  def counting_records(self, share):
    def count(*record):
      tick = tf.py_function(lambda: read.append(1) or 0, [], tf.int32)
      with tf.control_dependencies([tick]):
        return jax.tree.map(tf.identity, record)
    return real_records(self, share).map(count)

  monkeypatch.setattr(pipeline_lib._ShareTable, "records", counting_records)
  batch, = train_batches(data_dir, 1, batch_size=64, start_step=start_step,
                         shares=tuple(range(4)), num_shares=4)
  assert batch["image"].shape == (64, 8, 8, 3)
  return len(read)


def test_resuming_late_costs_no_more_reading_than_resuming_early(
    digits_tfrecord_data_dir, monkeypatch):
  """Streamed, reading to the first batch is bounded by the epoch, not the
  step."""
  early = records_read_before_first_batch(digits_tfrecord_data_dir, 100,
                                          monkeypatch)
  late = records_read_before_first_batch(digits_tfrecord_data_dir, 10**7,
                                         monkeypatch)
  assert early > 0 and late > 0
  # The skip stays within one epoch; the shuffle buffer (here the whole
  # epoch) and read-ahead may fill from the next epoch: two at the most.
  assert early <= 2 * 1437 and late <= 2 * 1437


def test_shares_must_be_consecutive_and_in_range(digits_data_dir):
  for shares in ((0, 2), (4,), ()):
    with pytest.raises(ValueError, match="consecutive indices in"):
      pipeline_lib.train_dataset(sources.lookup("digits", digits_data_dir),
                                 "train",
                                 batch_size=8,
                                 image_size=8,
                                 shares=shares,
                                 num_shares=4)


def eval_batches(data_dir, split, num_processes, batch_size):
  """Each process's batches when every process holds one share."""
  return [
      list(
          pipeline_lib.eval_dataset(
              sources.lookup("digits", data_dir),
              split,
              batch_size=batch_size * num_processes,
              image_size=8,
              shares=(index,),
              num_shares=num_processes).as_numpy_iterator())
      for index in range(num_processes)
  ]


def test_eval_sees_every_example_once_in_equal_batch_counts(digits_any_format):
  per_process = eval_batches(digits_any_format, "test", 3, batch_size=64)
  # ceil(ceil(360 / 3) / 64) batches each, the last one padded.
  assert [len(batches) for batches in per_process] == [2, 2, 2]
  assert sum(b["mask"].sum() for bs in per_process for b in bs) == 360
  all_real = collections.Counter()
  for batches in per_process:
    for batch in batches:
      assert batch["image"].shape == (64, 8, 8, 3)
      assert batch["mask"].dtype == np.float32
    all_real += pipeline_keys(batches)
  assert all_real == stored_keys(digits_any_format, "test")


def test_eval_pads_a_short_share_with_a_fully_masked_batch(digits_any_format):
  # 33 examples over 2 processes: shares of 17 and 16, so 2 batches of 16.
  first, second = eval_batches(digits_any_format, "test[:33]", 2,
                               batch_size=16)
  assert len(first) == len(second) == 2
  assert [b["mask"].sum() for b in first] == [16, 1]
  assert [b["mask"].sum() for b in second] == [16, 0]
  padding = first[1]["mask"] == 0
  assert (first[1]["image"][padding] == 0).all()


def one_pixel_image(size, row, col):
  image = np.full((size, size, 3), 10, np.uint8)
  image[row, col] = 255
  return image


def translated(image, rows, cols):
  """`image` moved by (rows, cols), uncovered pixels black (0)."""
  size = image.shape[0]
  padded = np.pad(image, ((1, 1), (1, 1), (0, 0)))
  return padded[1 - rows:1 - rows + size, 1 - cols:1 - cols + size]


def test_shift_translates_by_at_most_one_pixel_on_8x8():
  image = one_pixel_image(8, row=3, col=4)
  moves = {(r, c): translated(image, r, c)
           for r in (-1, 0, 1) for c in (-1, 0, 1)}
  seen = set()
  for seed in range(30):
    shifted = preprocess.shift(tf.constant(image), tf.constant([seed, 0]))
    shifted = shifted.numpy()
    matches = [m for m, expected in moves.items()
               if np.array_equal(shifted, expected)]
    assert len(matches) == 1, f"seed {seed}: not a 1-pixel translation"
    seen.add(matches[0])
  assert len(seen) > 4  # The content really moves, in several directions.


def test_flip_mirrors_some_images_and_keeps_others():
  image = one_pixel_image(8, row=2, col=1)
  outcomes = set()
  for seed in range(20):
    flipped = preprocess.flip(tf.constant(image), tf.constant([seed, 0]))
    flipped = flipped.numpy()
    if np.array_equal(flipped, image):
      outcomes.add("kept")
    elif np.array_equal(flipped, image[:, ::-1]):
      outcomes.add("mirrored")
  assert outcomes == {"kept", "mirrored"}


def test_inception_crop_samples_large_enough_regions():
  image = tf.zeros((224, 224, 3))
  for seed in range(20):
    height, width, _ = preprocess.inception_crop(
        image, tf.constant([seed, 0])).shape
    assert 0.05 <= height * width / 224**2 <= 1
    assert 3 / 4 - 0.05 <= width / height <= 4 / 3 + 0.05


def test_mae_crop_takes_a_fifth_of_the_image_at_least():
  image = tf.zeros((224, 224, 3))
  areas = []
  for seed in range(40):
    height, width, _ = preprocess.mae_crop(image, tf.constant([seed, 0])).shape
    areas.append(height * width / 224**2)
  # The area drawn from [0.2, 1], then rounded to whole pixels.
  assert 0.19 <= min(areas) < 0.4 and max(areas) <= 1


def test_inception_crop_batches_have_the_image_size(digits_data_dir):
  batch, = train_batches(digits_data_dir, 1, image_size=16,
                         augment=("inception_crop", "flip"))
  assert batch["image"].shape == (32, 16, 16, 3)


def test_resize_to_16_is_bilinear_and_aligned(digits_data_dir):
  [[small]] = eval_batches(digits_data_dir, "test[:10]", 1, batch_size=10)
  [large] = list(
      pipeline_lib.eval_dataset(sources.lookup("digits", digits_data_dir),
                                "test[:10]",
                                batch_size=10,
                                image_size=16).as_numpy_iterator())
  assert large["image"].shape == (10, 16, 16, 3)
  # Each 2x2 block of a 2x bilinear upsampling averages to the source pixel
  # blurred by [1/8, 3/4, 1/8] along each axis (away from the border); a
  # misaligned or nearest-neighbour resize would not.
  pooled = large["image"].reshape(10, 8, 2, 8, 2, 3).mean(axis=(2, 4))
  blurred = small["image"]
  for axis in (1, 2):
    blurred = (0.75 * blurred + 0.125 * np.roll(blurred, 1, axis)
               + 0.125 * np.roll(blurred, -1, axis))
  # Each resized pixel is rounded to uint8: off by at most 0.5.
  np.testing.assert_allclose(pooled[:, 1:-1, 1:-1], blurred[:, 1:-1, 1:-1],
                             atol=0.5 + 1e-9)


def test_unknown_augmentation_is_named():
  with pytest.raises(errors.InputError, match="augment: .*'rotate'"):
    preprocess.augmentation("flip,rotate")


def test_unknown_dataset_is_named(tmp_path):
  with pytest.raises(errors.InputError,
                     match="unknown dataset 'no_such_digits'"):
    sources.get_builder("no_such_digits", str(tmp_path))


def test_unprepared_tfds_dataset_is_an_error_not_a_download(tmp_path,
                                                            monkeypatch):
  def download_and_prepare(*args, **kwargs):
    raise AssertionError("tried to download")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare",
                      download_and_prepare)
  with pytest.raises(errors.InputError,
                     match="'cifar10' is not prepared in") as error:
    pipeline_lib.train_dataset(sources.lookup("cifar10", str(tmp_path)),
                               "train",
                               batch_size=8,
                               image_size=32)
  assert str(tmp_path) in str(error.value)
  assert not list(tmp_path.iterdir())


def test_processes_preparing_digits_at_once_all_succeed(tmp_path, monkeypatch):
  """In a local multi-process run every process prepares digits at startup."""
  split_generators = digits.Digits._split_generators

  def another_process_finishes_first(self, dl_manager):
    monkeypatch.setattr(digits.Digits, "_split_generators", split_generators)
    digits.Digits(data_dir=str(tmp_path)).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return split_generators(self, dl_manager)

  monkeypatch.setattr(digits.Digits, "_split_generators",
                      another_process_finishes_first)
  assert sources.lookup("digits", str(tmp_path)).num_examples("test") == 360


def test_to_global_builds_arrays_sharded_over_all_devices():
  mesh = jax.make_mesh((8,), ("data",))
  sharding = jax.sharding.NamedSharding(mesh,
                                        jax.sharding.PartitionSpec("data"))
  batch = {"image": np.arange(16 * 2 * 2 * 3, dtype=np.float32).reshape(
               16, 2, 2, 3),
           "label": tf.range(16, dtype=tf.int32)}
  arrays = sharding_lib.to_global(batch, sharding)
  assert arrays["image"].sharding == sharding
  assert len(arrays["label"].addressable_shards) == 8
  np.testing.assert_array_equal(arrays["image"], batch["image"])
  np.testing.assert_array_equal(arrays["label"], np.arange(16))


def gradient_image(height, width):
  """Distinct values everywhere: rows in channel 0, columns in channel 1."""
  rows = np.linspace(0, 255, height)[:, None]
  cols = np.linspace(0, 255, width)[None, :]
  return np.round(np.stack([np.broadcast_to(rows, (height, width)),
                            np.broadcast_to(cols, (height, width)),
                            rows * cols / 255], axis=-1)).astype(np.uint8)


def rounded_resize(image, size):
  """Bilinear resize, rounded to uint8, computed apart from preprocess."""
  resized = tf.image.resize(np.asarray(image, np.float32), size).numpy()
  return np.round(resized).astype(np.uint8)


def test_random_crop_crops_the_7_6_resized_image():
  image = gradient_image(20, 30)
  # 12 * 7 / 6 = 14: the crop starts at one of 3 x 3 offsets.
  resized = rounded_resize(image, (14, 14))
  offsets = set()
  for seed in range(12):
    crop = preprocess.random_crop(tf.constant(image), tf.constant([seed, 0]),
                                  image_size=12).numpy()
    assert crop.shape == (12, 12, 3)
    matches = [(top, left) for top in range(3) for left in range(3)
               if np.array_equal(crop, resized[top:top + 12, left:left + 12])]
    assert len(matches) == 1, f"seed {seed}: not a crop of the resized image"
    offsets.add(matches[0])
  assert len(offsets) > 3  # Different seeds, different offsets.


def test_random_crop_of_the_release_is_448_then_384():
  crop = preprocess.random_crop(tf.zeros((500, 300, 3), tf.uint8),
                                tf.constant([0, 0]), image_size=384)
  assert crop.shape == (384, 384, 3)
  assert round(384 * preprocess.RANDOM_CROP_RESIZE_FACTOR) == 448


def test_augment_image_keeps_the_streams_of_the_other_augmentations():
  """flip, shift, inception_crop get the same seeds and ignore image_size."""
  image = tf.constant(gradient_image(16, 16))
  seed = tf.constant([3, 4])
  names = ("inception_crop", "shift", "flip")
  seeds = tf.random.experimental.stateless_split(seed, num=3)
  expected = preprocess.inception_crop(image, seeds[0])
  expected = preprocess.shift(expected, seeds[1])
  expected = preprocess.flip(expected, seeds[2])
  np.testing.assert_array_equal(
      preprocess.augment_image(image, names, seed, 16), expected)
  cropped = preprocess.augment_image(image, ("random_crop", "flip"), seed, 8)
  assert cropped.shape == (8, 8, 3)


def test_random_crop_batches_are_the_image_size_and_in_range(
    digits_data_dir):
  batches = train_batches(digits_data_dir, 2, image_size=12,
                          augment="random_crop,flip", seed=2)
  again = train_batches(digits_data_dir, 2, image_size=12,
                        augment="random_crop,flip", seed=2)
  assert_same_batches(again, batches)
  for batch in batches:
    assert batch["image"].shape == (32, 12, 12, 3)
    assert batch["image"].dtype == np.uint8


def stored_test_images(data_dir, split):
  """The split's images decoded as the pipeline does, in file order."""
  examples = stored_examples(sources.get_builder("digits", data_dir), split)
  return [preprocess.decode(example["image"]) for example in examples]


# 14 -> 16, a margin of 1 each side; 10 -> 11, the odd row and column go to
# the bottom and right.
@pytest.mark.parametrize("image_size", [14, 10])
def test_eval_crop_fraction_resizes_larger_then_crops_the_centre(
    digits_data_dir, image_size):
  [batch] = list(
      pipeline_lib.eval_dataset(sources.lookup("digits", digits_data_dir),
                                "test[:10]",
                                batch_size=10,
                                image_size=image_size,
                                eval_crop_fraction=0.875).as_numpy_iterator())
  larger = round(image_size / 0.875)
  margin = (larger - image_size) // 2
  expected = np.stack([
      rounded_resize(image, (larger, larger))[
          margin:margin + image_size, margin:margin + image_size]
      for image in stored_test_images(digits_data_dir, "test[:10]")])
  assert batch["image"].shape == (10, image_size, image_size, 3)
  np.testing.assert_array_equal(batch["image"], expected)


def test_eval_crop_fraction_one_is_the_plain_resize(digits_data_dir):
  def batch(**kwargs):
    return next(
        pipeline_lib.eval_dataset(sources.lookup("digits", digits_data_dir),
                                  "test[:10]",
                                  batch_size=10,
                                  image_size=16,
                                  **kwargs).as_numpy_iterator())
  np.testing.assert_array_equal(batch(eval_crop_fraction=1.0)["image"],
                                batch()["image"])
  assert not np.array_equal(batch(eval_crop_fraction=0.5)["image"],
                            batch()["image"])


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, float("nan")])
def test_eval_crop_fraction_outside_0_1_is_refused(digits_data_dir, fraction):
  with pytest.raises(errors.InputError, match="eval_crop_fraction: must be in"):
    pipeline_lib.eval_dataset(sources.lookup("digits", digits_data_dir),
                              "test",
                              batch_size=8,
                              image_size=8,
                              eval_crop_fraction=fraction)


def test_missing_split_is_named_with_the_splits_there(digits_data_dir):
  with pytest.raises(errors.InputError, match="'validation'.*'train', 'test'"):
    pipeline_lib.train_dataset(sources.lookup("digits", digits_data_dir),
                               "validation",
                               batch_size=8,
                               image_size=8)


def noisy_image(height, width, channels=3):
  """uint8 pixels, smooth colours plus noise: JPEG's chroma has detail."""
  rng = np.random.default_rng(height * 1000 + width)
  coarse = rng.uniform(0, 255, (1, height // 8 + 2, width // 8 + 2, channels))
  smooth = tf.image.resize(coarse, (height, width), method="bicubic")[0]
  pixels = smooth.numpy() + rng.normal(0, 12, (height, width, channels))
  return np.clip(np.round(pixels), 0, 255).astype(np.uint8)


# (height, width, channels, chroma_downsampling): 4:2:0 (the default of
# libjpeg and of most photos), 4:4:4, grayscale; even and odd sizes.
JPEG_CASES = [(75, 100, 3, True), (101, 67, 3, True), (64, 80, 3, False),
              (57, 90, 1, True)]


def encoded_jpeg(height, width, channels, chroma_downsampling):
  return tf.io.encode_jpeg(noisy_image(height, width, channels), quality=90,
                           chroma_downsampling=chroma_downsampling)


@pytest.mark.parametrize("case", JPEG_CASES)
def test_decoding_only_the_crop_of_a_jpeg_gives_the_same_pixels(case):
  """Bitwise equal to a full decode then inception_crop, seed for seed."""
  encoded = encoded_jpeg(*case)
  crop_sizes = set()
  for seed in range(12):
    seed = tf.constant([seed, 1])
    fused = preprocess.decode_and_inception_crop(encoded, seed).numpy()
    expected = preprocess.inception_crop(preprocess.decode(encoded), seed)
    np.testing.assert_array_equal(fused, expected.numpy())
    assert fused.shape[2] == 3
    crop_sizes.add(fused.shape)
  assert len(crop_sizes) > 6  # Real, varied crops, not the whole image.


def test_without_the_margin_subsampled_chroma_differs_at_the_edges(
    monkeypatch):
  """Why JPEG_CROP_MARGIN: libjpeg takes a tight window's edge for the
  image's when it upsamples 4:2:0 chroma."""
  monkeypatch.setattr(preprocess, "JPEG_CROP_MARGIN", 0)
  encoded = encoded_jpeg(*JPEG_CASES[0])
  differing = 0
  for seed in range(12):
    seed = tf.constant([seed, 1])
    fused = preprocess.decode_and_inception_crop(encoded, seed).numpy()
    expected = preprocess.inception_crop(preprocess.decode(encoded),
                                         seed).numpy()
    if not np.array_equal(fused, expected):
      differing += 1
      inside = np.s_[:, 1:-1]  # The columns away from the window's edges.
      np.testing.assert_array_equal(fused[inside], expected[inside])
  assert differing > 0


@pytest.mark.parametrize("channels", [3, 4, 1])
def test_a_png_is_decoded_whole_then_cropped(channels):
  encoded = tf.io.encode_png(noisy_image(40, 30, channels))
  for seed in range(5):
    seed = tf.constant([seed, 2])
    fused = preprocess.decode_and_inception_crop(encoded, seed)
    expected = preprocess.inception_crop(preprocess.decode(encoded), seed)
    np.testing.assert_array_equal(fused, expected)
    assert fused.shape[2] == 3


@pytest.mark.parametrize("names", [
    ("inception_crop", "flip"), ("inception_crop",),
    ("inception_crop", "shift", "flip"), ("flip", "inception_crop"),
    ("random_crop", "flip"), ("mae_crop", "flip"), ()])
def test_decode_and_augment_is_decode_then_augment_image(names):
  """In tf.data's graph mode too, where the crop is decoded first."""
  jpeg = encoded_jpeg(*JPEG_CASES[1])
  png = tf.io.encode_png(noisy_image(40, 30))

  @tf.function
  def fused(encoded, seed):
    return preprocess.decode_and_augment(encoded, names, seed, 16)

  @tf.function
  def expected(encoded, seed):
    return preprocess.augment_image(preprocess.decode(encoded), names, seed,
                                    16)

  for encoded in (jpeg, png):
    for seed in range(4):
      seed = tf.constant([seed, 3], tf.int64)
      np.testing.assert_array_equal(fused(encoded, seed),
                                    expected(encoded, seed))


def test_train_batches_of_jpegs_are_those_of_a_full_decode(tmp_path,
                                                           monkeypatch):
  """The pipeline's inception_crop batches, decoding only crops, equal the
  batches it made when it decoded every image whole."""
  for index, (height, width) in enumerate([(60, 80), (80, 60), (61, 79)] * 4):
    path = tmp_path / "images" / f"class{index % 2}" / f"{index}.jpg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_jpeg(noisy_image(height, width)).numpy())

  def batches():
    return take(
        pipeline_lib.train_dataset(sources.lookup(
            f"folder:{tmp_path / 'images'}", str(tmp_path / "data")),
                                   "train",
                                   batch_size=8,
                                   image_size=32,
                                   augmentation=preprocess.augmentation(
                                       "inception_crop,flip"),
                                   seed=4,
                                   shares=(0, 1),
                                   num_shares=2), 3)

  fused = batches()
  monkeypatch.setattr(
      preprocess, "decode_and_augment",
      lambda encoded, names, seed, image_size: preprocess.augment_image(
          preprocess.decode(encoded), names, seed, image_size))
  assert_same_batches(fused, batches())
