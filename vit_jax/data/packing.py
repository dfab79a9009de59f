"""Several training images in each sequence (NaViT's Patch n' Pack):
config.naflex.packing.

Each image is read at its own size (models/naflex.py's `native_grid`,
shrunk only where it alone exceeds the sequence), optionally at a sampled
resolution and with a share of its patches dropped (pipeline.py), and the
input pipeline's per-image batches are packed here, on the host, into
sequences of `length` patches holding at most `slots` images each. A
share's `sequences` sequences of a step read ceil(sequences *
per_sequence) images.

The packing is first-fit, share by share (data/shares.py): share s's images
of step k (its block of the step's image batch, in stream order) go each
into the first of the share's sequences with room for its patches and a
free slot; then the images of step k - 1 that found no room there fill
what is left, and those that find none again are dropped (counted). So a
step's sequences depend on the images of two steps only: a run resumed at
step k reads from step k - 1 (O(1), whatever k) and packs what an
uninterrupted run packed, and the batches depend on the shares, not on how
many processes read them. An image that did not decode takes no place (it
is counted, as broken_records.py counts it).

A packed batch: "image" uint8 [N, length, p * p * 3] (each image's kept
patches contiguous, in its row-major order), "segments" int32 [N, length]
(the slot, 1 .. slots, of each patch's image; 0 for padding), "positions"
int32 [N, length, 2] (each patch's (row, col) in its image's grid), "grids"
int32 [N, slots, 2], "label" [N, slots, ...], "mask" float32 [N, slots] (1
for an image), "broken" and "dropped" int32 [N] (images of the share that
did not decode, or found no room, counted on its first sequence). The
model reads it as a models.naflex.Packed; the loss averages over images.
"""

import math
import queue
import threading
from typing import NamedTuple

import numpy as np

from vit_jax import errors


class Packing(NamedTuple):
  """How a run packs its training images (config.naflex)."""
  length: int  # a sequence's patches: max_num_patches
  slots: int  # the most images one sequence holds
  per_sequence: float  # images read for each sequence of a step
  min_side: int = 0  # resolution sampling (preprocess.sampled_scale); 0: off
  max_side: int = 0
  token_drop: float = 0.0  # the share of an image's patches dropped
  token_drop_sampled: bool = False  # each image's share from U(0, 2 x it)

  @classmethod
  def of(cls, naflex):
    """The Packing of a run's config.naflex section (runs/settings.py), or
    None where it does not pack."""
    if not naflex.packing:
      return None
    slots = naflex.max_images_per_sequence or math.ceil(
        2 * naflex.images_per_sequence)
    return cls(naflex.max_num_patches, slots, naflex.images_per_sequence,
               naflex.min_side, naflex.max_side, naflex.token_drop,
               naflex.token_drop_sampled)

  def check(self):
    """A ConfigError naming the key of a setting that cannot pack."""
    if not self.length:
      raise errors.ConfigError(
          "config.naflex.packing packs sequences of "
          "config.naflex.max_num_patches patches: set it (e.g. 256)")
    if self.slots < self.per_sequence:
      # Every step would leave over images that never find a sequence.
      raise errors.ConfigError(
          f"config.naflex.max_images_per_sequence={self.slots} is below "
          f"config.naflex.images_per_sequence={self.per_sequence:g}, the "
          "images read for each sequence: give at least "
          f"{math.ceil(self.per_sequence)}, or 0 (twice "
          "images_per_sequence)")
    if bool(self.min_side) != bool(self.max_side) or (
        self.min_side > self.max_side):
      raise errors.ConfigError(
          f"config.naflex.min_side={self.min_side} and max_side="
          f"{self.max_side}: set both, min_side <= max_side, or neither")
    if self.token_drop_sampled and self.token_drop >= 0.5:
      raise errors.ConfigError(
          f"config.naflex.token_drop={self.token_drop} with "
          "token_drop_sampled draws shares up to twice it, which must stay "
          "below 1: give less than 0.5")

  def images_per_share(self, sequences):
    """The images a share of `sequences` sequences reads each step: its
    window."""
    return math.ceil(sequences * self.per_sequence)


def first_fit(tokens, used, filled, length, slots):
  """The first sequence with room for `tokens` patches and a free slot
  (`used` patches and `filled` slots of each so far), or -1."""
  fits = np.flatnonzero((used + tokens <= length) & (filled < slots))
  return int(fits[0]) if fits.size else -1


class _Share:
  """The packing of one share's sequences, step by step."""

  def __init__(self, sequences, packing):
    self.sequences = sequences
    self.packing = packing
    self.left_over = None  # The last step's images that found no room.

  def pack(self, images, out):
    """Packs this step's `images` (the share's block of the image batch:
    numpy arrays with a leading axis of images), then the images of the
    step before that found no room, into `out` (the share's rows of a
    packed batch, zeros)."""
    used = np.zeros(self.sequences, np.int64)
    filled = np.zeros(self.sequences, np.int64)
    real = np.flatnonzero(images["mask"] > 0)
    out["broken"][0] = len(images["mask"]) - len(real)
    no_room = self._place(images, real, used, filled, out)
    if self.left_over is not None:
      out["dropped"][0] = len(self._place(
          self.left_over, np.arange(len(self.left_over["tokens"])), used,
          filled, out))
    self.left_over = {key: value[no_room] for key, value in images.items()}

  def _place(self, source, order, used, filled, out):
    """Puts images `order` of `source`, in turn, each in the first
    sequence with room (`used` patches and `filled` slots so far, updated);
    returns those that found none."""
    length, slots = self.packing.length, self.packing.slots
    placed, where, no_room = [], [], []
    for i in order:
      tokens = int(source["tokens"][i])
      s = first_fit(tokens, used, filled, length, slots)
      if s < 0:
        no_room.append(i)
        continue
      placed.append(i)
      where.append((s, used[s], filled[s]))
      used[s] += tokens
      filled[s] += 1
    if not placed:
      return no_room
    # The copies at once: patch j of placed image i goes to sequence s at
    # at + j.
    placed = np.asarray(placed)
    sequence, at, slot = np.asarray(where).T
    count = source["tokens"][placed].astype(np.int64)
    image = np.repeat(placed, count)
    patch = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count,
                                               count)
    rows, columns = np.repeat(sequence, count), np.repeat(at, count) + patch
    out["image"][rows, columns] = source["image"][image, patch]
    out["positions"][rows, columns] = source["positions"][image, patch]
    out["segments"][rows, columns] = np.repeat(slot + 1, count)
    out["grids"][sequence, slot] = source["grid"][placed]
    out["label"][sequence, slot] = source["label"][placed]
    out["mask"][sequence, slot] = 1.0
    return no_room


def packed(batches, num_shares, sequences, packing, skip_first=False):
  """The packed batches (module docstring) of a process's per-image
  `batches` (pipeline.train_dataset's with `packing`, each the process's
  `num_shares` blocks of the step's image batch, concatenated), each
  block into `sequences` sequences of its own, made on a thread of their
  own ahead of the step that takes them (`ahead`). `skip_first`: pack the
  first batch only for its left-over images (a resumed run's step before
  its first)."""
  return ahead(_packed(batches, num_shares, sequences, packing, skip_first))


def _packed(batches, num_shares, sequences, packing, skip_first):
  shares = [_Share(sequences, packing) for _ in range(num_shares)]
  for batch in batches:
    out = _zeros(batch, num_shares * sequences, packing)
    rows = len(batch["label"]) // num_shares
    for j, share in enumerate(shares):
      share.pack({key: value[j * rows:(j + 1) * rows]
                  for key, value in batch.items()},
                 {key: value[j * sequences:(j + 1) * sequences]
                  for key, value in out.items()})
    if skip_first:
      skip_first = False
      continue
    yield out


def batch_shapes(n, patch_values, packing, label=((), np.int32)):
  """{name: (shape, dtype)} of a packed batch (module docstring) of `n`
  sequences of patches of `patch_values` uint8 values; `label`: an image's
  label's (shape, dtype)."""
  length, slots = packing.length, packing.slots
  return {"image": ((n, length, patch_values), np.uint8),
          "segments": ((n, length), np.int32),
          "positions": ((n, length, 2), np.int32),
          "grids": ((n, slots, 2), np.int32),
          "label": ((n, slots, *label[0]), label[1]),
          "mask": ((n, slots), np.float32),
          "broken": ((n,), np.int32),
          "dropped": ((n,), np.int32)}


def _zeros(images, n, packing):
  """An empty packed batch of `n` sequences for `images`' pixels and
  labels."""
  label = images["label"]
  return {name: np.zeros(shape, dtype) for name, (shape, dtype) in
          batch_shapes(n, images["image"].shape[-1], packing,
                       (label.shape[1:], label.dtype)).items()}


_END = object()


def ahead(items, depth=2):
  """`items`, each made on a thread of its own up to `depth` ahead of the
  one taken: the host packs while the devices run the step. An exception
  there is raised here, at the item it stopped; closing this generator
  (a finished or abandoned loop) stops the thread."""
  made, stopped = queue.Queue(depth), threading.Event()

  def put(item):
    while not stopped.is_set():
      try:
        made.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def make():
    try:
      for item in items:
        if not put(item):
          return
      put(_END)
    except BaseException as e:  # pylint: disable=broad-except
      put(e)

  threading.Thread(target=make, daemon=True, name="packing").start()
  try:
    while True:
      item = made.get()
      if item is _END:
        return
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:
    stopped.set()
