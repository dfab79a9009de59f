"""TFDS -> tf.data -> per-process batches -> global jax.Arrays.

Training reads a split in one of two ways, by the format it is stored in:

  - ArrayRecord, at random (random_access.py): epoch e is a permutation of
    the whole split, the record at each position of the run's stream is
    computed from (seed, epoch, position), and a process reads its rows of
    each global batch. Resuming at step k starts reading at batch k.
  - TFRecord, streamed in `num_shares` shares (`tfds.even_splits`): share s
    feeds block s of every global batch, shuffled within a buffer of its
    own (config.input_shares, vit_jax/data/shares.py). Resuming jumps to the
    step's epoch and skips the records of that epoch before it.

Either way a process reads only the rows of its data-parallel devices, the
global batches depend neither on how many processes there are nor on how
many devices, augmentations are seeded per example by its position in the
stream, and a resumed run sees the same batches as an uninterrupted one. A
process decodes a batch's rows at once (broken_records.decode_blocks): an
image that does not decode becomes a masked row, in its place.

Evaluation reads each data-parallel device's share of a split in order,
from either format. sharding.to_global assembles each process's rows into
arrays over all devices. The datasets come as `Source`s
(vit_jax/data/sources.py), looked up once per run.
"""

import jax
import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from vit_jax import errors
from vit_jax.data import broken_records, preprocess, random_access
from vit_jax.data.lazy_tensorflow import tf
from vit_jax.data.random_access import as_written

PREFETCH_BATCHES = 2
# Records a process holds to shuffle, over all the shares it reads: a share
# shuffles within SHUFFLE_RECORDS / input_shares of them. On ImageNet-sized
# records, about 9 GB of encoded JPEGs on a host that reads every share.
SHUFFLE_RECORDS = 80_000
# Shares read at once: their records come from files of their own.
PARALLEL_SHARES = 16
# A shuffle window below this many records (and below a share) earns the
# hint to convert to ArrayRecord: ImageNet in 2,048 shares shuffles within
# 39, in 8 within 10,000.
SMALL_WINDOW = 10_000
# Each share reads its files through a buffer of its own; a host may read
# thousands of shares.
READ_BUFFER_BYTES = 1 << 20
_FOREVER = 2**62  # Epochs in an "infinite" stream.
# The key of the random-access reader's one stream, where the streaming
# reader's keys name its shares (0, 1, ...).
WHOLE_SPLIT = -1
# Folded into an example's seed for packing's draws (its resolution, the
# patches it drops).
SIDE_DRAW, DROP_DRAW = 0x73696465, 0x64726f70  # "side", "drop"
# And for the caption drawn among an image's (image-text training).
CAPTION_DRAW = 0x63617074  # "capt"
# A dataset of captions alone has no labels: what evaluation's rows carry.
NO_LABEL = -1


def train_dataset(source, split, *, batch_size, image_size,
                  augmentation=preprocess.Augmentation(), seed=0,
                  start_step=0, shares=(0,), num_shares=1,
                  shuffle_records=SHUFFLE_RECORDS,
                  naflex=None, packing=None,
                  tokenize=None) -> "tf.data.Dataset":
  """Infinite, reproducible stream of this process's rows of every batch.

  The global batch of `batch_size` examples is `num_shares` equal blocks,
  and a process yields the blocks `shares` (the consecutive shares of the
  devices it drives) concatenated: {"image": uint8 [rows, image_size,
  image_size, 3] (preprocess.py: `augmentation`, RandAugment's after the
  resize),
  "label": int32 [rows], "mask": float32 [rows], "index": int32 [rows]},
  rows = batch_size / num_shares * len(shares). "mask" is 0.0 for an
  example whose image does not decode, a row of zeros, and "index" is each
  record's position in the split (broken_records.py).

  With `naflex` (a models.naflex.Budget), each augmented image keeps its
  aspect ratio instead: "image" is its patches, uint8 [rows,
  max_num_patches, p * p * 3], and "grid" int32 [rows, 2] its grid
  (preprocess.naflex_patches); every batch has the same shapes, the budget.
  With `packing` too (data/packing.py's Packing; `naflex` then reads each
  image at its own size), its resolution may be sampled and a share of its
  patches dropped: "image" holds the kept patches first, "positions" int32
  [rows, max_num_patches, 2] their places in the grid and "tokens" int32
  [rows] their count, for packing.packed to pack.

  With `tokenize` (numpy bytes [rows] -> int32 [rows, length]: a
  tokenizer's, data/tokenizer.py), each image's caption, one of its
  record's drawn from the example's seed, is tokenised in the pipeline:
  "tokens" int32 [rows, length] in place of "label" (image-text
  training; the source must have captions).

  An ArrayRecord split is read at random (module docstring): the blocks
  only say which rows of each batch are the process's, and the batches do
  not depend on `num_shares`. A TFRecord split is streamed: block s of
  every batch comes from share s of the split, shuffled within a buffer of
  shuffle_records / num_shares records (all of a share that is smaller),
  so that a process holds at most `shuffle_records`; the batches are the
  same for any number of processes and devices that divides `num_shares`
  (vit_jax/data/shares.py).

  Batch k of a stream started at `start_step` equals batch start_step + k
  of one started at 0, augmentations included. Resuming reads nothing
  before the step's batch (ArrayRecord) or at most one epoch of each share
  (TFRecord: the epoch of `start_step` is computed rather than replayed,
  and only its records before the position are read, not decoded).
  """
  block = _block_size(batch_size, image_size, shares, num_shares)
  source.num_examples(split)  # A missing split's error.
  if tokenize and source.captions is None:
    raise errors.InputError(
        f"dataset {source.name!r} has no captions (a \"captions\" or "
        "\"caption\" feature) to train two towers on: caption its labels "
        "with config.image_text.templates and class_names")
  if not tokenize and source.label is None:
    raise errors.InputError(
        f"dataset {source.name!r} has captions but no labels: train two "
        "towers on them (config.objective 'image_text', its templates "
        "empty)")
  if random_access.readable(source):
    # Read at random: the rows are the process's, whatever the shares.
    records = random_access.Records(source, split)
    key = tf.constant([seed, WHOLE_SPLIT], tf.int64)
    rows = random_access.stream(
        records, seed=seed, batch_size=batch_size, start_step=start_step,
        rows=(shares[0] * block, (shares[-1] + 1) * block)).map(
            as_written(lambda position, record: (key, position, record)))
  else:
    rows = _streamed_rows(source, split, seed, start_step, block, shares,
                          num_shares, shuffle_records)

  def train_example(key, position, record):
    # Seeded by the example's position in its stream: the same pixels
    # wherever the run (re)started, whoever reads it.
    example_seed = tf.random.experimental.stateless_fold_in(key, position)
    image = preprocess.decode_and_augment(record[1][source.image_key],
                                          augmentation.names, example_seed,
                                          image_size)
    if packing:
      return packable(image, example_seed) | target(record[1], example_seed)
    if naflex:
      pixels, grid = preprocess.naflex_patches(image, *naflex)
      return {"image": pixels, "grid": grid,
              **target(record[1], example_seed)}
    image = preprocess.resize(image, image_size)
    return {"image": preprocess.randaugment(image, augmentation,
                                            example_seed),
            **target(record[1], example_seed)}

  def target(example, example_seed):
    """{"label": its class}, or {"caption": one of its captions, drawn by
    the example's seed; "" where it has none}."""
    if not tokenize:
      return {"label": source.label(example)}
    captions = source.captions(example)
    count = tf.shape(captions)[0]
    draw = tf.random.stateless_uniform(
        [], tf.random.experimental.stateless_fold_in(example_seed,
                                                     CAPTION_DRAW),
        0, tf.maximum(count, 1), tf.int32)
    return {"caption": tf.concat([captions, [""]], 0)[
        tf.minimum(draw, count)]}

  def packable(image, example_seed):
    # Draws of their own, folded off the example's seed, so that turning
    # them on leaves the augmentations' draws as they were.
    scale = 1.0
    if packing.max_side:
      scale = preprocess.sampled_scale(
          image, packing.min_side, packing.max_side,
          tf.random.experimental.stateless_fold_in(example_seed, SIDE_DRAW))
    pixels, grid = preprocess.naflex_patches(image, *naflex, scale=scale)
    if not packing.token_drop:  # Every patch, in its place.
      return {"image": pixels, "grid": grid,
              "positions": preprocess.grid_positions(grid, pixels.shape[0]),
              "tokens": grid[0] * grid[1]}
    drop_seed = tf.random.experimental.stateless_fold_in(example_seed,
                                                         DROP_DRAW)
    rate = tf.constant(packing.token_drop, tf.float32)
    if packing.token_drop_sampled:
      rate = tf.random.stateless_uniform(
          [], tf.random.experimental.stateless_fold_in(drop_seed, 1), 0.0,
          2 * packing.token_drop)
    pixels, positions, tokens = preprocess.drop_patches(pixels, grid, rate,
                                                        drop_seed)
    return {"image": pixels, "grid": grid, "positions": positions,
            "tokens": tokens}

  batches = broken_records.decode_blocks(
      [rows], block * len(shares), train_example,
      index=lambda key, position, record: record[0])
  if tokenize:
    batches = batches.map(_tokenized(tokenize))
  return _prefetched(batches)


def _tokenized(tokenize):
  """A batch with its "caption" strings tokenised by `tokenize` into
  "tokens" (in Python: a SentencePiece model is no TensorFlow op)."""

  def tokenized(batch):
    batch = dict(batch)
    captions = batch.pop("caption")
    tokens = tf.numpy_function(tokenize, [captions], tf.int32,
                               stateful=False)
    tokens.set_shape([captions.shape[0], None])
    return {**batch, "tokens": tokens}

  return tokenized


def _streamed_rows(source, split, seed, start_step, block, shares,
                   num_shares, shuffle_records):
  """(key, position, (index, example)) of the process's rows of each
  batch, streamed from TFRecord files: share s's block of a batch, then
  share s + 1's, ...; key names the share's stream, position is in it."""
  table = _ShareTable(source, split, num_shares)
  if min(table.sizes) == 0:
    raise errors.InputError(
        f"split {split!r} of {source.builder.name} has fewer examples than "
        f"the {num_shares} shares it is read in (config.input_shares)")
  buffer = max(1, shuffle_records // num_shares)
  hint = shuffle_hint(source, split, buffer, max(table.sizes))
  if hint and jax.process_index() == 0:
    logging.warning(hint)

  @as_written
  def share_stream(share):
    size = table.size(share)
    key = tf.stack([tf.constant(seed, tf.int64), share])
    records = table.records(share)

    @as_written
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
    return examples.map(
        as_written(lambda position, record: (key, position, record)))

  # The shares' reading overlaps.
  return tf.data.Dataset.range(shares[0], shares[-1] + 1).interleave(
      share_stream, cycle_length=len(shares), block_length=block,
      num_parallel_calls=min(len(shares), PARALLEL_SHARES),
      deterministic=True)


def shuffle_hint(source, split, window, share_size):
  """One line on converting `source` to ArrayRecord, where its TFRecord
  shares shuffle within `window` records, fewer than SMALL_WINDOW and than
  a share holds; else None."""
  if window >= min(SMALL_WINDOW, share_size):
    return None
  return (f"{source.name} {split} is TFRecord: each share shuffles within "
          f"{window} of its {share_size} records, so an epoch's batches are "
          f"close to the last epoch's. Read at random, every epoch is a "
          f"permutation of the split: python -m vit_jax.convert_dataset "
          f"--dataset={source.name} --data_dir=DATA_DIR --out_data_dir=OUT "
          f"and train with --config.data_dir=OUT")


def eval_dataset(source, split, *, batch_size, image_size, shares=(0,),
                 num_shares=1, eval_crop_fraction=1.0, extras=None,
                 naflex=None) -> "tf.data.Dataset":
  """This process's rows of every evaluation batch over `split`, once.

  As in training, block s of every global batch comes from share s of the
  split; the process yields the blocks of `shares` concatenated: {"image",
  "label", "mask": float32 [rows], "index": int32 [rows]}. "mask" is 1.0 for
  an example, 0.0 for padding and for an example whose image does not
  decode; "index" is the record's position in the split, -1 in padding
  (broken_records.py). Every share yields the same number of blocks,
  ceil(largest share / block), so that the collectives of a multi-host
  evaluation line up and every example is counted exactly once.

  `extras`, if given, maps a TFDS example to a dict of further fixed-shape
  tensors to yield beside those (zeros in padding): ReaL's label sets.

  Images are resized to image_size (eval_crop_fraction 1.0), or with
  eval_crop_fraction f in (0, 1) to round(image_size / f) and centrally
  cropped to image_size, as `preprocess.eval_resize`; with `naflex`, each
  image at its own aspect ratio, as train_dataset's ("grid" beside
  "image"; (0, 0) in padding).
  """
  block = _block_size(batch_size, image_size, shares, num_shares)
  preprocess.check_crop_fraction(eval_crop_fraction)
  source.num_examples(split)  # A missing split's error.
  table = _ShareTable(source, split, num_shares)
  num_blocks = -(-max(table.sizes) // block)  # Ceiling division.

  @as_written
  def slim(index, example):
    # What evaluation reads of a record, in shapes that padding can take.
    return index, {"image": example[source.image_key],
                   "label": (source.label(example) if source.label
                             else tf.constant(NO_LABEL, tf.int32)),
                   **(extras(example) if extras else {})}

  def eval_example(index, record):
    del index
    image = preprocess.decode(record["image"])
    if naflex:
      pixels, grid = preprocess.naflex_patches(image, *naflex)
      return {**record, "image": pixels, "grid": grid}
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
  return _prefetched(broken_records.decode_blocks(
      streams, block, eval_example, index=lambda index, record: index))


class _ShareTable:
  """Where each share of a split lies in the record files, as tensors, so
  that one traced function reads any share (`records`)."""

  def __init__(self, source, split, num_shares):
    builder = source.builder
    self.random = None
    if random_access.readable(source):
      self.random = random_access.Records(source, split)
    elif builder.info.file_format != tfds.core.FileFormat.TFRECORD:
      raise errors.InputError(
          f"{builder.name} is stored as {builder.info.file_format.value}; "
          f"vit_jax reads TFRecord files (streamed) and ArrayRecord files "
          f"(at random): prepare it again as one of them")
    self.splits = tfds.even_splits(split, num_shares)
    instructions = [builder.info.splits[s].file_instructions
                    for s in self.splits]
    self.sizes = [sum(i.take for i in share) for share in instructions]
    width = max(len(share) for share in instructions)
    padded = [share + [None] * (width - len(share)) for share in instructions]
    self._sizes = tf.constant(self.sizes, tf.int64)
    self.offsets = np.cumsum([0] + self.sizes[:-1])
    self._offsets = tf.constant(self.offsets, tf.int64)
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
    """The examples of share `share` (an int or a scalar tensor) of TFRecord
    files in file order, the image left encoded."""
    @as_written
    def read(filename, skip, take):
      return tf.data.TFRecordDataset(
          filename, buffer_size=READ_BUFFER_BYTES).skip(skip).take(take)

    pieces = tf.data.Dataset.from_tensor_slices(
        (self._files[share], self._skips[share], self._takes[share]))
    records = pieces.filter(as_written(lambda f, skip, take: take > 0))
    return records.flat_map(read).map(as_written(
        lambda record: random_access.encoded_example(self.source, record)))

  def records(self, share):
    """(position in the split, example) of share `share`'s examples; share
    an int where the split is ArrayRecord."""
    if self.random is not None:
      start = int(self.offsets[share])
      return self.random.range(start, start + self.sizes[share])
    examples = self.examples(share).map(as_written(
        lambda example: random_access.with_fixed_image(self.source, example)))
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
  # iterator would stall its caller that long. Parallel maps use every core,
  # and PREFETCH_BATCHES keep the devices fed.
  options.autotune.enabled = False
  return options
