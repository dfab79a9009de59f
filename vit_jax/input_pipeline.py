"""TFDS -> tf.data -> per-process batches -> global jax.Arrays.

Every process of a multi-host run calls the same functions with its own
`process_index`; each reads only its share of the split. Batches are
per-process; `to_global` assembles them into arrays over all devices.

Training streams are deterministic functions of (seed, step): the shuffle is
seeded, augmentations are seeded per example, and `start_step` skips encoded
records, so a resumed run sees the same batches as an uninterrupted one.
"""

import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

# Imported for its side effect: registering the shipped TFDS builders.
from vit_jax import datasets  # pylint: disable=unused-import
from vit_jax import preprocess

# Built by vit_jax.datasets, so prepared on first use instead of requiring
# `tfds build`.
SHIPPED_DATASETS = ("digits",)
PREFETCH_BATCHES = 2


def get_builder(dataset: str, data_dir: str | None):
  """The prepared TFDS builder of `dataset`; never downloads anything.

  `dataset` is a TFDS name ("cifar10", "imagenet2012:5.1.0", ...) or one of
  SHIPPED_DATASETS, which is prepared into `data_dir` the first time. Other
  datasets must have been prepared in `data_dir` (None: TFDS's default)
  beforehand.
  """
  builder = _builder(dataset, data_dir)
  if builder.is_prepared():
    return builder
  if builder.name not in SHIPPED_DATASETS:
    raise ValueError(
        f"dataset {dataset!r} is not prepared in {builder.data_dir}: TFDS "
        f"datasets must be prepared beforehand (`tfds build {builder.name} "
        f"--data_dir=DIR`, after any manual download its documentation asks "
        f"for) and data_dir set to DIR; vit_jax does not download data")
  _prepare_shipped(builder)
  # A fresh builder reads the info of the files on disk, whoever wrote them.
  return _builder(dataset, data_dir)


def _builder(dataset, data_dir):
  try:
    return tfds.builder(dataset, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    # TFDS's own message lists every dataset it knows, burying the point.
    raise ValueError(
        f"unknown dataset {dataset!r}: it is not a TFDS dataset nor one "
        f"shipped with vit_jax ({', '.join(SHIPPED_DATASETS)})") from None


def _prepare_shipped(builder):
  """Generates a shipped dataset, tolerating a process that did it first.

  The processes of a local multi-process run all prepare at once; TFDS
  generates into a private directory and renames it into place, so every
  process but the first fails on the rename and finds the data there.
  """
  offline = tfds.download.DownloadConfig(try_download_gcs=False)
  try:
    builder.download_and_prepare(download_config=offline)
  except OSError:
    if not builder.is_prepared():
      raise


def num_classes(dataset: str, data_dir: str | None) -> int:
  return get_builder(dataset, data_dir).info.features["label"].num_classes


def num_examples(dataset: str, split: str, data_dir: str | None) -> int:
  """Examples in `split`, which may be a slice such as "train[:90%]"."""
  return get_builder(dataset, data_dir).info.splits[split].num_examples


def train_dataset(dataset, split, *, batch_size, image_size, augment=(),
                  seed=0, start_step=0, process_index=0, process_count=1,
                  data_dir=None, shuffle_buffer=10_000) -> tf.data.Dataset:
  """Infinite, reproducible stream of this process's training batches.

  Yields {"image": float32 [batch_size, image_size, image_size, 3] in [-1, 1],
  "label": int32 [batch_size]}; batch_size is per process. Batch k of a
  stream started at `start_step` equals batch start_step + k of one started
  at 0, augmentations included.
  """
  _check_batching(batch_size, image_size, process_index, process_count)
  names = preprocess.parse_augmentations(augment)
  builder = get_builder(dataset, data_dir)
  examples = builder.as_dataset(
      split=tfds.even_splits(split, process_count)[process_index],
      # Seeded file order, new each epoch: the buffer below only mixes
      # records that are near each other in the files.
      shuffle_files=True,
      read_config=tfds.ReadConfig(shuffle_seed=seed),
      decoders={"image": tfds.decode.SkipDecoding()})
  examples = examples.shuffle(shuffle_buffer, seed=seed,
                              reshuffle_each_iteration=True).repeat()
  # Counted before the skip, so that an example's index, and with it its
  # augmentation, does not depend on where the run started.
  examples = examples.enumerate().skip(start_step * batch_size)

  def train_example(index, example):
    # Unique across processes: process p's examples get the global indices
    # congruent to p modulo process_count.
    global_index = index * process_count + process_index
    example_seed = tf.stack([tf.constant(seed, tf.int64), global_index])
    image = preprocess.decode(example["image"])
    image = preprocess.augment_image(image, names, example_seed)
    return {"image": preprocess.resize(image, image_size),
            "label": tf.cast(example["label"], tf.int32)}

  batches = examples.map(train_example, num_parallel_calls=tf.data.AUTOTUNE,
                         deterministic=True)
  batches = batches.batch(batch_size, drop_remainder=True)
  return batches.prefetch(PREFETCH_BATCHES).with_options(_options())


def eval_dataset(dataset, split, *, batch_size, image_size, process_index=0,
                 process_count=1, data_dir=None) -> tf.data.Dataset:
  """This process's share of `split`, once, in full batches with a mask.

  Yields {"image", "label", "mask": float32 [batch_size]}, mask 0 marking
  padding. Every process yields the same number of batches,
  ceil(largest share / batch_size), so that collectives over a multi-host
  evaluation line up; a process with fewer examples pads more.
  """
  _check_batching(batch_size, image_size, process_index, process_count)
  builder = get_builder(dataset, data_dir)
  shares = tfds.even_splits(split, process_count)
  largest_share = max(builder.info.splits[share].num_examples
                      for share in shares)
  num_batches = -(-largest_share // batch_size)  # Ceiling division.

  def eval_example(example):
    image = preprocess.decode(example["image"])
    return {"image": preprocess.resize(image, image_size),
            "label": tf.cast(example["label"], tf.int32),
            "mask": tf.constant(1.0)}

  examples = builder.as_dataset(
      split=shares[process_index], shuffle_files=False,
      decoders={"image": tfds.decode.SkipDecoding()})
  examples = examples.map(eval_example, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
  padding = tf.data.Dataset.from_tensors({
      "image": tf.zeros((image_size, image_size, 3)),
      "label": tf.constant(0),
      "mask": tf.constant(0.0),
  }).repeat()
  examples = examples.concatenate(padding).take(num_batches * batch_size)
  batches = examples.batch(batch_size, drop_remainder=True)
  return batches.prefetch(PREFETCH_BATCHES).with_options(_options())


def _check_batching(batch_size, image_size, process_index, process_count):
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  if image_size < 1:
    raise ValueError(f"image_size must be positive, got {image_size}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is not in "
                     f"[0, process_count={process_count})")


def _options():
  options = tf.data.Options()
  options.deterministic = True
  # No autotuning: its thread sleeps in waits that grow to a minute and does
  # not wake when the iterator is deleted, so every finished or abandoned
  # iterator stalled its caller that long. Parallel maps use every core, and
  # PREFETCH_BATCHES keep the devices fed.
  options.autotune.enabled = False
  return options


def to_global(batch: dict, sharding) -> dict:
  """Per-process batch (numpy or tf) -> global jax.Arrays laid out by sharding.

  Each process's batch becomes the rows held by its devices; `sharding` must
  split only the leading (batch) axis across processes.
  """
  return {
      name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
      for name, value in batch.items()
  }
