"""TFDS -> tf.data -> per-process batches -> global jax.Arrays.

A split is read in `num_shares` shares (`tfds.even_splits`): share s feeds
block s of every global batch. Training reads a fixed number of them
(config.input_shares, vit_jax/elastic.py), each data-parallel device a
consecutive group; evaluation one per data-parallel device. A process reads
only the shares of the devices it drives, so the shares of a pod's hosts
are disjoint and cover the split, and the global batches depend neither on
how many processes there are nor, in training, on how many devices.
`to_global` assembles each process's rows into arrays over all devices.

Training streams are deterministic functions of (seed, step): each epoch's
shuffle has its own seed, augmentations are seeded per example, and
`start_step` jumps to its epoch and skips encoded records within it, so a
resumed run sees the same batches as an uninterrupted one. A process decodes
a batch's rows of all its shares at once (broken_images.decode_blocks): an
image that does not decode becomes a masked row, in its place.

A dataset is a TFDS name, one shipped with vit_jax ("digits"),
"folder:PATH", a folder of images laid out by class (see
vit_jax/datasets/folder.py), or "vtab:TASK", a VTAB-1k task (a TFDS dataset
and the label the task reads from it, vit_jax/datasets/vtab.py). Shipped
datasets and folders are prepared into `data_dir` on first use.
"""

import contextlib
import dataclasses
import io
import os
from typing import Callable

import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

# Imported for its side effect: registering the shipped TFDS builders.
from vit_jax import datasets  # pylint: disable=unused-import
from vit_jax import broken_images, errors, preprocess
from vit_jax.datasets import folder, vtab

# Built by vit_jax.datasets, so prepared on first use instead of requiring
# `tfds build`.
SHIPPED_DATASETS = ("digits",)
# "folder:PATH": the images under PATH, prepared on first use (datasets/folder).
FOLDER_PREFIX = folder.PREFIX
VTAB_PREFIX = "vtab:"
# Datasets whose class label is not the feature "label": ImageNet ReaL's
# validation images carry the original ImageNet label beside the ReaL sets.
LABEL_FEATURES = {"imagenet2012_real": "original_label"}
PREFETCH_BATCHES = 2
# Records a process holds to shuffle, over all the shares it reads: a share
# shuffles within SHUFFLE_RECORDS / input_shares of them. On ImageNet-sized
# records, about 9 GB of encoded JPEGs on a host that reads every share.
SHUFFLE_RECORDS = 80_000
# Shares read at once: their records come from files of their own.
PARALLEL_SHARES = 16
# Each share reads its files through a buffer of its own; a host may read
# thousands of shares.
READ_BUFFER_BYTES = 1 << 20
_FOREVER = 2**62  # Epochs in an "infinite" stream.


def get_builder(dataset: str, data_dir: str | None):
  """The prepared TFDS builder of `dataset`; never downloads anything.

  `dataset` is a TFDS name ("cifar10", "imagenet2012:5.1.0", ...), one of
  SHIPPED_DATASETS, or "folder:PATH"; the last two are prepared into
  `data_dir` the first time (a folder again whenever its files change). Other
  datasets must have been prepared in `data_dir` (None or "", as configs
  leave it: TFDS's default) beforehand.
  """
  data_dir = data_dir or None
  if dataset.startswith(FOLDER_PREFIX):
    return _folder_builder(dataset[len(FOLDER_PREFIX):], data_dir)
  builder = _builder(dataset, data_dir)
  if builder.is_prepared():
    return builder
  if builder.name not in SHIPPED_DATASETS:
    raise errors.InputError(
        f"dataset {dataset!r} is not prepared in {builder.data_dir}: TFDS "
        f"datasets must be prepared beforehand (`tfds build {builder.name} "
        f"--data_dir=DIR`, after any manual download its documentation asks "
        f"for) and data_dir set to DIR; vit_jax does not download data")
  _prepare_here(builder)
  # A fresh builder reads the info of the files on disk, whoever wrote them.
  return _builder(dataset, data_dir)


def _folder_builder(root, data_dir):
  # Named by a fingerprint of the folder's files: a changed folder is a new
  # config, prepared afresh, and never the stale copy of an earlier one.
  config = folder.make_config(root)
  builder = folder.Folder(config=config, data_dir=data_dir)
  if builder.is_prepared():
    return builder
  _prepare_here(builder)
  builder = folder.Folder(config=config, data_dir=data_dir)
  broken = folder.broken_files(builder)
  if broken and jax.process_index() == 0:
    print(describe_broken(broken, builder), flush=True)
  return builder


def describe_broken(broken, builder, shown=3):
  """What a folder's preparation left out, in a few lines."""
  total = sum(split.num_examples for split in builder.info.splits.values())
  lines = [f"Left out {len(broken)} of {total + len(broken)} files of "
           f"{builder.builder_config.root} that do not decode as images "
           f"(all listed in {os.path.join(builder.data_dir, folder.BROKEN_FILES)}):"]
  lines += [f"  {relative}: {reason}" for relative, reason in broken[:shown]]
  if len(broken) > shown:
    lines.append(f"  ... and {len(broken) - shown} more")
  return "\n".join(lines)


def check_broken_images(dataset, data_dir, policy):
  """Refuses a folder dataset that left images out, where `policy`
  (config.broken_images) is "refuse"; "skip" trains on the rest."""
  broken_images.check_policy(policy)
  if policy == "skip" or not dataset.startswith(FOLDER_PREFIX):
    return
  builder = get_builder(dataset, data_dir)
  broken = folder.broken_files(builder)
  if broken:
    raise errors.InputError(
        f"{len(broken)} files of {builder.builder_config.root} do not decode "
        f"as images, and config.broken_images is 'refuse': first "
        f"{broken[0][0]} ({broken[0][1]}); all listed in "
        f"{os.path.join(builder.data_dir, folder.BROKEN_FILES)}")


def _builder(dataset, data_dir):
  try:
    return tfds.builder(dataset, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    # TFDS's own message lists every dataset it knows, burying the point.
    where = data_dir or ("TFDS's default data_dir ($TFDS_DATA_DIR or "
                         "~/tensorflow_datasets)")
    raise errors.InputError(
        f"unknown dataset {dataset!r}: it is not a TFDS dataset nor one "
        f"shipped with vit_jax ({', '.join(SHIPPED_DATASETS)}), nor a folder "
        f"of images ({FOLDER_PREFIX}PATH), and {where} holds no prepared "
        f"copy of it. A dataset outside the TFDS catalog (JFT-300M, "
        f"ImageNet-21k) is read from its TFDS files: put them in "
        f"DATA_DIR/{dataset.split(':')[0]}/VERSION/ (dataset_info.json, "
        f"features.json and the record files, with features 'image' and a "
        f"ClassLabel 'label', as `tfds build` of your own builder writes "
        f"them) and set config.data_dir=DATA_DIR") from None


def _prepare_here(builder):
  """Generates a shipped or folder dataset; another process may do it first.

  The processes of a local multi-process run all prepare at once; TFDS
  generates into a private directory and renames it into place, so every
  process but the first fails on the rename and finds the data there.
  """
  offline = tfds.download.DownloadConfig(try_download_gcs=False)
  if jax.process_index() == 0:
    print(f"Preparing dataset {builder.name} in {builder.data_dir} (once)",
          flush=True)
  try:
    with _quiet_unless_verbose():
      builder.download_and_prepare(download_config=offline)
  except OSError:
    if not builder.is_prepared():
      raise


def _quiet_unless_verbose():
  """Hides TFDS's own report and progress bars of a preparation, unless the
  log is at INFO (`--verbose`)."""
  if logging.level_info():
    return contextlib.nullcontext()
  sink = io.StringIO()
  stack = contextlib.ExitStack()
  stack.enter_context(contextlib.redirect_stdout(sink))
  stack.enter_context(contextlib.redirect_stderr(sink))
  return stack


@dataclasses.dataclass(frozen=True)
class Source:
  """A prepared dataset, and how an example's image and class are read."""
  builder: tfds.core.DatasetBuilder
  num_classes: int
  label: Callable  # TFDS example (image still encoded) -> int32 class
  image_key: str = "image"
  fix_image: Callable | None = None  # encoded image -> encoded image


def get_source(dataset: str, data_dir: str | None) -> Source:
  """The Source of `dataset` (see the module docstring for the names)."""
  if dataset.startswith(VTAB_PREFIX):
    task = vtab.get(dataset[len(VTAB_PREFIX):])
    builder = get_builder(task.tfds_name, data_dir)
    label = task.label or _feature("label")
    return Source(builder, task.num_classes, label, task.image_key,
                  task.image)
  builder = get_builder(dataset, data_dir)
  key = LABEL_FEATURES.get(builder.name, "label")
  return Source(builder, builder.info.features[key].num_classes, _feature(key))


def _feature(key):
  return lambda example: tf.cast(example[key], tf.int32)


def num_classes(dataset: str, data_dir: str | None) -> int:
  return get_source(dataset, data_dir).num_classes


def num_examples(dataset: str, split: str, data_dir: str | None) -> int:
  """Examples in `split`, which may be a slice such as "train[:90%]"."""
  return _num_examples(get_source(dataset, data_dir).builder, dataset, split)


def _num_examples(builder, dataset, split):
  try:
    return builder.info.splits[split].num_examples
  except (KeyError, ValueError) as e:
    hint = ""
    if dataset.startswith(FOLDER_PREFIX):
      hint = (f" A folder's splits are its split folders (root/<split>/"
              f"<class>/<image>), or a single {folder.SINGLE_SPLIT!r} split "
              f"when the class folders are directly in it (root/<class>/"
              f"<image>); slice that, e.g. train_split "
              f"'{folder.SINGLE_SPLIT}[:90%]' and evaluators.test.split "
              f"'{folder.SINGLE_SPLIT}[90%:]'.")
    raise errors.InputError(f"dataset {dataset!r}: {e}{hint}") from None


def train_dataset(dataset, split, *, batch_size, image_size, augment=(),
                  seed=0, start_step=0, shares=(0,), num_shares=1,
                  data_dir=None,
                  shuffle_records=SHUFFLE_RECORDS) -> tf.data.Dataset:
  """Infinite, reproducible stream of this process's rows of every batch.

  The global batch of `batch_size` examples is `num_shares` equal blocks:
  block s of every batch comes from share s of the split (`tfds.even_splits`),
  shuffled anew each epoch. A process reads only the shares in `shares` (the
  consecutive shares of the devices it drives) and yields their blocks
  concatenated: {"image": uint8 [rows, image_size, image_size, 3]
  (preprocess.py), "label": int32 [rows], "mask": float32 [rows], "index":
  int32 [rows]}, rows = batch_size / num_shares * len(shares). "mask" is 0.0
  for an example whose image does not decode, a row of zeros, and "index" is
  each record's position in the split (broken_images.py).

  Nothing here depends on the devices: share s is the same stream whoever
  reads it, so the global batches are the same for any number of processes
  and devices that divides `num_shares` (vit_jax/elastic.py). Batch k of a
  stream started at `start_step` equals batch start_step + k of one started
  at 0, augmentations included. Resuming reads at most one epoch of each
  share, however late the step: the epoch of `start_step` is computed rather
  than replayed, and only the records of that epoch before the position are
  skipped (read, not decoded).

  Each share shuffles within a buffer of shuffle_records / num_shares
  records (all of a share that is smaller), so that a process holds at most
  `shuffle_records` however many shares it reads.
  """
  names = preprocess.parse_augmentations(augment)
  block = _block_size(batch_size, image_size, shares, num_shares)
  source = get_source(dataset, data_dir)
  _num_examples(source.builder, dataset, split)  # A missing split's error.
  table = _ShareTable(source, split, num_shares)
  if min(table.sizes) == 0:
    raise errors.InputError(
        f"split {split!r} of {source.builder.name} has fewer examples than "
        f"the {num_shares} shares it is read in (config.input_shares)")
  buffer = max(1, shuffle_records // num_shares)

  def share_stream(share):
    size = table.size(share)
    key = tf.stack([tf.constant(seed, tf.int64), share])
    records = table.records(share)

    def epoch(number):
      # Each epoch shuffles with its own seed, a function of (seed, share,
      # epoch), so that any epoch can be built directly.
      epoch_seed = tf.random.stateless_uniform(
          [], seed=tf.random.experimental.stateless_fold_in(key, number),
          minval=None, maxval=None, dtype=tf.int64)
      return records.shuffle(tf.minimum(size, buffer), seed=epoch_seed,
                             reshuffle_each_iteration=False)

    first = start_step * block  # Records of this share consumed before.
    first_epoch = first // size
    examples = tf.data.Dataset.range(first_epoch, _FOREVER).flat_map(epoch)
    examples = examples.enumerate(start=first_epoch * size)
    examples = examples.skip(first - first_epoch * size)
    return examples.map(lambda position, record: (key, position, record))

  def train_example(key, position, record):
    # Seeded by the example's position in its share's stream: the same
    # pixels wherever the run (re)started, whoever reads the share.
    example_seed = tf.random.experimental.stateless_fold_in(key, position)
    image = preprocess.decode_and_augment(record[1][source.image_key], names,
                                          example_seed, image_size)
    return {"image": preprocess.resize(image, image_size),
            "label": source.label(record[1])}

  # Block b of share s, then of share s + 1, ...: the process's rows of a
  # batch in the order of the global batch. The shares' reading overlaps.
  rows = tf.data.Dataset.range(shares[0], shares[-1] + 1).interleave(
      share_stream, cycle_length=len(shares), block_length=block,
      num_parallel_calls=min(len(shares), PARALLEL_SHARES),
      deterministic=True)
  return _prefetched(broken_images.decode_blocks(
      [rows], block * len(shares), train_example,
      index=lambda key, position, record: record[0]))


def eval_dataset(dataset, split, *, batch_size, image_size, shares=(0,),
                 num_shares=1, data_dir=None, eval_crop_fraction=1.0,
                 extras=None) -> tf.data.Dataset:
  """This process's rows of every evaluation batch over `split`, once.

  As in training, block s of every global batch comes from share s of the
  split; the process yields the blocks of `shares` concatenated: {"image",
  "label", "mask": float32 [rows], "index": int32 [rows]}. "mask" is 1.0 for
  an example, 0.0 for padding and for an example whose image does not
  decode; "index" is the record's position in the split, -1 in padding
  (broken_images.py). Every share yields the same number of blocks,
  ceil(largest share / block), so that the collectives of a multi-host
  evaluation line up and every example is counted exactly once.

  `extras`, if given, maps a TFDS example to a dict of further fixed-shape
  tensors to yield beside those (zeros in padding): ReaL's label sets.

  Images are resized to image_size (eval_crop_fraction 1.0), or with
  eval_crop_fraction f in (0, 1) to round(image_size / f) and centrally
  cropped to image_size, as `preprocess.eval_resize`.
  """
  block = _block_size(batch_size, image_size, shares, num_shares)
  preprocess.check_crop_fraction(eval_crop_fraction)
  source = get_source(dataset, data_dir)
  _num_examples(source.builder, dataset, split)  # A missing split's error.
  table = _ShareTable(source, split, num_shares)
  num_blocks = -(-max(table.sizes) // block)  # Ceiling division.

  def slim(index, example):
    # What evaluation reads of a record, in shapes that padding can take.
    return index, {"image": example[source.image_key],
                   "label": source.label(example),
                   **(extras(example) if extras else {})}

  def eval_example(index, record):
    del index
    image = preprocess.decode(record["image"])
    return {**record, "image": preprocess.eval_resize(image, image_size,
                                                      eval_crop_fraction)}

  streams = []
  for share in shares:
    examples = table.records(share).map(slim)
    padding = tf.data.Dataset.from_tensors((
        tf.constant(-1, tf.int64),
        tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype),
                              examples.element_spec[1]))).repeat()
    streams.append(examples.concatenate(padding).take(num_blocks * block))
  return _prefetched(broken_images.decode_blocks(
      streams, block, eval_example, index=lambda index, record: index))


class _ShareTable:
  """Where each share of a split lies in the record files, as tensors, so
  that one traced function reads any share (`records`)."""

  def __init__(self, source, split, num_shares):
    builder = source.builder
    if builder.info.file_format != tfds.core.FileFormat.TFRECORD:
      raise errors.InputError(
          f"{builder.name} is stored as {builder.info.file_format.value}; "
          f"training reads TFRecord files, the format `tfds build` writes "
          f"by default: prepare it again without --file_format")
    self.splits = tfds.even_splits(split, num_shares)
    instructions = [builder.info.splits[s].file_instructions
                    for s in self.splits]
    self.sizes = [sum(i.take for i in share) for share in instructions]
    width = max(len(share) for share in instructions)
    padded = [share + [None] * (width - len(share)) for share in instructions]
    self._sizes = tf.constant(self.sizes, tf.int64)
    self._offsets = tf.constant(np.cumsum([0] + self.sizes[:-1]), tf.int64)
    self._files = tf.constant([[i.filename if i else "" for i in share]
                              for share in padded])
    self._skips = tf.constant([[i.skip if i else 0 for i in share]
                              for share in padded], tf.int64)
    self._takes = tf.constant([[i.take if i else 0 for i in share]
                              for share in padded], tf.int64)
    self.source = source

  def size(self, share):
    return tf.gather(self._sizes, share)

  def examples(self, share):
    """The examples of share `share` (an int or a scalar tensor) in file
    order, the image left encoded (decoding is the pipeline's, which can
    crop while decoding)."""
    features = self.source.builder.info.features
    decoders = {self.source.image_key: tfds.decode.SkipDecoding()}

    def read(filename, skip, take):
      return tf.data.TFRecordDataset(
          filename, buffer_size=READ_BUFFER_BYTES).skip(skip).take(take)

    pieces = tf.data.Dataset.from_tensor_slices(
        (self._files[share], self._skips[share], self._takes[share]))
    records = pieces.filter(lambda f, skip, take: take > 0).flat_map(read)
    return records.map(
        lambda record: features.deserialize_example(record, decoders=decoders))

  def records(self, share):
    """(position in the split, example) of share `share`'s examples."""
    examples = self.examples(share)
    if self.source.fix_image is not None:
      key, fix = self.source.image_key, self.source.fix_image
      examples = examples.map(lambda e: {**e, key: fix(e[key])})
    return examples.enumerate(start=tf.gather(self._offsets, share))


def _block_size(batch_size, image_size, shares, num_shares):
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  if image_size < 1:
    raise ValueError(f"image_size must be positive, got {image_size}")
  if batch_size % num_shares:
    raise ValueError(f"batch_size={batch_size} is not divisible into "
                     f"{num_shares} equal blocks")
  shares = list(shares)
  if not shares or any(not 0 <= s < num_shares for s in shares) or (
      shares != list(range(shares[0], shares[0] + len(shares)))):
    raise ValueError(f"shares must be consecutive indices in [0, "
                     f"{num_shares}), got {shares}")
  return batch_size // num_shares


def _prefetched(batches):
  return batches.prefetch(PREFETCH_BATCHES).with_options(_options())


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
  """Per-process rows (numpy or tf) -> global jax.Arrays laid out by sharding.

  `sharding` splits the leading (example) axis only; each process passes the
  rows its devices hold, as `train_dataset` and `eval_dataset` yield them.
  """
  return {
      name: jax.make_array_from_process_local_data(sharding, np.asarray(value))
      for name, value in batch.items()
  }
