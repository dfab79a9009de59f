"""Reading a split stored as ArrayRecord by index, with Grain.

A dataset that TFDS wrote as ArrayRecord (`file_format=array_record`, what
vit_jax prepares digits and folders as, and what `python -m
vit_jax.convert_dataset` makes of a TFRecord dataset) can be read at any
record. Training then needs no shares and no shuffle buffer:

  - epoch e of a run is a permutation of the whole split, Grain's index
    shuffle seeded by (seed, e): no buffer, nothing held that grows with the
    split;
  - position p of the run's stream (batch k holds positions k x batch_size
    to (k + 1) x batch_size - 1) is record Order(p), computed, never read up
    to: a resumed run at step k starts reading at batch k, however late;
  - a process reads the positions of its rows of each batch and nothing
    else, so a global batch is the same for any number of processes and
    devices.

Records are read in TensorFlow's input threads (a tf.py_function over
Grain's ArrayRecordDataSource) and parsed, decoded and augmented by the
same TensorFlow functions as the streaming TFRecord reader (pipeline.py):
tf.data's parallel map does that work faster than per-example calls from
Grain's own threads (docs/input_pipeline.md, "Speed"). ArrayRecord is read
from local paths only (a bucket through a gcsfuse mount), as the
array_record library opens files.
"""

import grain
import numpy as np
import tensorflow_datasets as tfds

from vit_jax import errors
from vit_jax.data.lazy_tensorflow import tf

# Grain's own choice for its ShuffleMapDataset.
SHUFFLE_ROUNDS = 4
# Records a reading call asks for at once when reading a range (evaluation).
READ_CHUNK = 256
def as_written(function):
  """`function`, to be traced by tf.data as written, not rewritten by
  AutoGraph (broken_records.decode_blocks says why): every function handed
  to tf.data here and in pipeline.py."""
  return tf.autograph.experimental.do_not_convert(function)


def readable(source) -> bool:
  """Whether `source` (a data/sources.py Source) is stored as ArrayRecord."""
  return source.builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD


class Order:
  """Which record of a split of `size` records sits at each position of a
  run's stream: epoch e = p // size is a permutation of the split seeded by
  (seed, e), position p % size of it."""

  def __init__(self, size: int, seed: int):
    if size < 1:
      raise ValueError(f"a split to shuffle needs records, got {size}")
    self.size, self.seed = int(size), int(seed)
    self._epoch_seeds = {}

  def epoch_seed(self, epoch: int) -> int:
    """The index shuffle's 32-bit seed of `epoch`: SeedSequence mixes the
    pair, so that run seed s's epoch 1 is not run seed s + 1's epoch 0
    (as seed + epoch would make it)."""
    if epoch not in self._epoch_seeds:
      mixed = np.random.SeedSequence([self.seed % 2**63, epoch])
      self._epoch_seeds[epoch] = int(mixed.generate_state(1)[0])
    return self._epoch_seeds[epoch]

  def __call__(self, positions) -> np.ndarray:
    """The record indices (int64) at stream `positions`."""
    positions = np.asarray(positions, np.int64)
    indices = np.empty_like(positions)
    for i, position in enumerate(positions.flat):
      epoch, offset = divmod(int(position), self.size)
      indices.flat[i] = grain.experimental.index_shuffle(
          offset, max_index=self.size - 1, seed=self.epoch_seed(epoch),
          rounds=SHUFFLE_ROUNDS)
    return indices


class Records:
  """The records of one split, by index (0 is the split's first record in
  file order, the position the streaming reader gives it too)."""

  def __init__(self, source, split):
    self.source = source
    instructions = source.builder.info.splits[split].file_instructions
    if any("://" in i.filename for i in instructions):
      raise errors.InputError(
          f"{source.name} is ArrayRecord in {source.builder.data_dir}, and "
          f"ArrayRecord files are read from local paths only: mount the "
          f"bucket (gcsfuse) and set config.data_dir to the mount")
    self._records = grain.sources.ArrayRecordDataSource(instructions)
    self.size = len(self._records)

  def read(self, indices) -> np.ndarray:
    """The serialized records at `indices`, as a numpy array of bytes."""
    indices = [int(i) for i in np.asarray(indices).flat]
    return np.array(self._records.__getitems__(indices), dtype=object)

  def range(self, start, stop) -> "tf.data.Dataset":
    """(index, example) of the records start..stop-1, in order."""
    return tf.data.Dataset.range(start, stop).batch(READ_CHUNK).map(
        as_written(lambda indices: (indices, self.at(indices)))).unbatch(
        ).map(as_written(lambda index, record: (index, self.parse(record))))

  def at(self, indices):
    """The serialized records at `indices` (an int64 tensor), in a tf.data
    function: `read` in a tf.py_function."""
    records = tf.py_function(self.read, [indices], tf.string)
    return tf.ensure_shape(records, indices.shape)

  def parse(self, record):
    return with_fixed_image(self.source, encoded_example(self.source, record))


def encoded_example(source, record):
  """A serialized record of `source` -> its TFDS example, the image left
  encoded (the pipeline decodes it, cropping as it decodes where it can)."""
  return source.builder.info.features.deserialize_example(
      record, decoders={source.image_key: tfds.decode.SkipDecoding()})


def with_fixed_image(source, example):
  """`example` with its image mended where `source` says how (a VTAB task's
  `fix_image`)."""
  if source.fix_image is None:
    return example
  return {**example, source.image_key: source.fix_image(
      example[source.image_key])}


def stream(records, *, seed, batch_size, rows, start_step):
  """(position, (index, example)) of this process's rows of every global
  batch from `start_step` on: `rows` = (first, stop), the rows of a batch
  the process holds. Positions are the run's stream's; the index is the
  record's in the split."""
  order = Order(records.size, seed)
  first, stop = rows
  offsets = tf.range(first, stop, dtype=tf.int64)

  @as_written
  def read(step):
    positions = step * batch_size + offsets
    indices = tf.ensure_shape(tf.py_function(order, [positions], tf.int64),
                              positions.shape)
    return positions, indices, records.at(indices)

  # Two batches read at once: the next one's reads overlap this one's.
  steps = tf.data.Dataset.range(start_step, 2**62)
  return steps.map(read, num_parallel_calls=2, deterministic=True).unbatch(
  ).map(as_written(lambda position, index, record: (
      position, (index, records.parse(record)))))
