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
dataset, before training: see vit_jax/data/folder.py).
"""

import functools

import jax
import numpy as np
from absl import logging

from vit_jax import errors
from vit_jax.data.lazy_tensorflow import tf

POLICIES = ("skip", "refuse")
SHOWN = 5  # Broken records named in the log, per split and process.
# Batches decoded at once: the next one is under way while the current one
# finishes, so the cores never wait at a batch's end.
BLOCKS_IN_FLIGHT = 2


def check_policy(policy):
  if policy not in POLICIES:
    raise errors.InputError(
        f"config.broken_images must be one of {POLICIES}, got {policy!r}")


def decode_blocks(shares, block_size, decode, index):
  """Decodes the examples of `shares` a global batch at a time.

  `shares` are datasets of examples, one per share a process reads, each
  long enough for every batch. Each block yields the next `block_size`
  examples of every share, in share order: `decode(*example)`'s dict of
  fixed-shape tensors stacked, plus "mask" (float32: 1.0; 0.0 and zeros
  elsewhere where `decode` fails or the example is padding) and "index"
  (int32 `index(*example)`, the record's position in its split; padding's
  is negative and is not decoded).
  """
  # Traced once, for both passes: tracing a decode is slow. No function of
  # the pipeline is left to AutoGraph, which would rewrite its source at
  # each trace (docs/input_pipeline.md): each is traced as written, its
  # branches tf.cond, its loops over Python values.
  @tf.function(autograph=False)
  def decoded(*example):
    return {**decode(*example), "mask": tf.constant(1.0),
            "index": tf.cast(index(*example), tf.int32)}

  shapes = decoded.get_concrete_function(
      *shares[0].element_spec).structured_outputs

  @tf.autograph.experimental.do_not_convert
  def broken(*example):
    return {**{key: tf.zeros(value.shape, value.dtype)
               for key, value in shapes.items()},
            "mask": tf.constant(0.0),
            "index": tf.cast(index(*example), tf.int32)}

  @tf.autograph.experimental.do_not_convert
  def row(*example):
    return tf.cond(index(*example) >= 0, lambda: decoded(*example),
                   lambda: broken(*example))

  @tf.autograph.experimental.do_not_convert
  def one_by_one(*example):
    # ignore_errors here sees only this example's decoding, never a read
    # error of the records upstream, which must still stop the run.
    example = tf.data.Dataset.from_tensors(example)
    return example.map(row).ignore_errors().concatenate(
        example.map(broken)).take(1)

  size = block_size * len(shares)

  @tf.autograph.experimental.do_not_convert
  def block(*windows):
    # Windows hold their examples without copying them, and can be read
    # twice: at once, then one by one if some image fails.
    rows = functools.reduce(tf.data.Dataset.concatenate,
                            [tf.data.Dataset.zip(w) for w in windows])
    # drop_remainder: after a failure, the rows that follow must not come
    # out as a shorter block of their own.
    fast = rows.map(row, num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True).batch(size, drop_remainder=True)
    careful = rows.flat_map(one_by_one).batch(size)
    return fast.ignore_errors().concatenate(careful).take(1)

  windows = tf.data.Dataset.zip(tuple(share.window(block_size)
                                      for share in shares))
  return windows.interleave(block, cycle_length=BLOCKS_IN_FLIGHT,
                            num_parallel_calls=BLOCKS_IN_FLIGHT,
                            deterministic=True)


def named(batches, what, policy, keep_index=False):
  """`batches` (numpy, with "index" and "mask") without "index" (unless
  `keep_index`: evaluation's, where an evaluator needs each example's
  place), naming the first SHOWN broken examples in a warning, or raising
  an InputError at the first one where `policy` is "refuse". Padding rows
  (index -1) are not examples. `what` names the split: "digits train"."""
  shown = 0
  for batch in batches:
    index = batch["index"] if keep_index else batch.pop("index")
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
