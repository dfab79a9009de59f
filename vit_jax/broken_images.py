"""Examples whose image does not decode: dropped, counted and named.

At ImageNet scale a few records of any dataset do not decode (a truncated
file, bytes that are no image at all), and one of them must not stop a run,
nor every restart of it at the same record. The input pipeline decodes each
block of a batch in one pass, as fast as if nothing could fail; only a block
in which some image fails is decoded again, one example at a time, and each
failing example becomes a row of zeros with "mask" 0. The row keeps its
place: batches still hold the records they would hold, augmentation seeds
and the resume position are unchanged, and a resumed run drops the very
records an uninterrupted one drops. Training weighs its loss by the mask,
evaluation counts only rows whose mask is 1.

Each row carries "index", its record's position in the split (in the order
TFDS stores it, the order of `tfds.load(..., shuffle_files=False)`), which
`named` turns into a warning for the first few broken records a process
meets, before the batch goes to the devices.

config.broken_images: "skip" trains and evaluates on the rest; "refuse"
stops the run with an error at the first broken image (and, for a folder
dataset, before training: see vit_jax/datasets/folder.py).
"""

import jax
import numpy as np
import tensorflow as tf
from absl import logging

from vit_jax import errors

POLICIES = ("skip", "refuse")
SHOWN = 5  # Broken records named in the log, per split and process.
# Blocks decoded at once per share: the next one is under way while the
# current one finishes, so the cores never wait at a block's end.
BLOCKS_IN_FLIGHT = 2


def check_policy(policy):
  if policy not in POLICIES:
    raise errors.InputError(
        f"config.broken_images must be one of {POLICIES}, got {policy!r}")


def decode_blocks(examples, block_size, decode, index):
  """Decodes `examples` in blocks of `block_size` (the last may be short).

  `decode(*example)` maps one example to a dict of fixed-shape tensors,
  `index(*example)` gives its record's position in the split. Yields per
  block `decode`'s tensors stacked, plus "mask" (float32: 1.0; 0.0 and zeros
  elsewhere where `decode` fails) and "index" (int32).
  """
  decoded_spec = examples.map(decode).element_spec

  def decoded(*example):
    return {**decode(*example), "mask": tf.constant(1.0),
            "index": tf.cast(index(*example), tf.int32)}

  def broken(*example):
    return {**{key: tf.zeros(spec.shape, spec.dtype)
               for key, spec in decoded_spec.items()},
            "mask": tf.constant(0.0),
            "index": tf.cast(index(*example), tf.int32)}

  def one_by_one(*example):
    # ignore_errors here sees only this example's decoding, never a read
    # error of the records upstream, which must still stop the run.
    example = tf.data.Dataset.from_tensors(example)
    return example.map(decoded).ignore_errors().concatenate(
        example.map(broken)).take(1)

  def block(*window):
    # A window holds its examples without copying them, and can be read
    # twice: at once, then one by one if some image fails.
    rows = tf.data.Dataset.zip(window)
    size = rows.reduce(tf.constant(0, tf.int64), lambda count, *_: count + 1)
    # drop_remainder: after a failure, the rows that follow must not come
    # out as a shorter block of their own.
    fast = rows.map(decoded, num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True).batch(size, drop_remainder=True)
    careful = rows.flat_map(one_by_one).batch(block_size)
    return fast.ignore_errors().concatenate(careful).take(1)

  return examples.window(block_size).interleave(
      block, cycle_length=BLOCKS_IN_FLIGHT,
      num_parallel_calls=BLOCKS_IN_FLIGHT, deterministic=True)


def named(batches, what, policy):
  """`batches` (numpy, with "index" and "mask") without "index", naming the
  first SHOWN broken examples in a warning, or raising an InputError at the
  first one where `policy` is "refuse". Padding rows (index -1) are not
  examples. `what` names the split: "digits train"."""
  shown = 0
  for batch in batches:
    index = batch.pop("index")
    broken = index[(batch["mask"] == 0) & (index >= 0)]
    if broken.size and policy == "refuse":
      raise errors.InputError(
          f"example {broken[0]} of {what} does not decode as an image, and "
          f"config.broken_images is 'refuse' ('skip' trains without it)")
    for position in broken[:max(SHOWN - shown, 0)]:
      shown += 1
      logging.warning(
          "Skipped example %d of %s: its image does not decode%s", position,
          what, "" if shown < SHOWN else
          " (further ones are counted in metrics.jsonl, not named)")
    yield batch


class Count:
  """Training examples skipped over a workdir's runs; each step adds its
  count (a device scalar) without waiting for it."""

  def __init__(self, earlier=0):
    self._total = int(earlier)
    self._pending = []

  def add(self, skipped):
    self._pending.append(skipped)

  def total(self):
    self._total += int(np.sum(jax.device_get(self._pending)))
    self._pending = []
    return self._total
