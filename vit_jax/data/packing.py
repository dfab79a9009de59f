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
    """InputError naming the key of a setting that cannot pack."""
    if not self.length:
      raise errors.InputError(
          "config.naflex.packing packs sequences of "
          "config.naflex.max_num_patches patches: set it (e.g. 256)")
    if bool(self.min_side) != bool(self.max_side) or (
        self.min_side > self.max_side):
      raise errors.InputError(
          f"config.naflex.min_side={self.min_side} and max_side="
          f"{self.max_side}: set both, min_side <= max_side, or neither")
    if self.token_drop_sampled and self.token_drop >= 0.5:
      raise errors.InputError(
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

  def pack(self, images):
    """The packed sequences of this step's `images` (the share's block of
    the image batch: numpy arrays with a leading axis of images), and the
    images of the step before that found no room."""
    n, length, slots = self.sequences, self.packing.length, self.packing.slots
    label = images["label"]
    out = {"image": np.zeros((n, length, images["image"].shape[-1]),
                             images["image"].dtype),
           "segments": np.zeros((n, length), np.int32),
           "positions": np.zeros((n, length, 2), np.int32),
           "grids": np.zeros((n, slots, 2), np.int32),
           "label": np.zeros((n, slots, *label.shape[1:]), label.dtype),
           "mask": np.zeros((n, slots), np.float32),
           "broken": np.zeros(n, np.int32),
           "dropped": np.zeros(n, np.int32)}
    used = np.zeros(n, np.int64)
    filled = np.zeros(n, np.int64)

    def place(source, i):
      """Puts image i of `source` in the first sequence it fits: True, or
      False where none has room."""
      tokens = int(source["tokens"][i])
      s = first_fit(tokens, used, filled, length, slots)
      if s < 0:
        return False
      at, slot = used[s], filled[s]
      out["image"][s, at:at + tokens] = source["image"][i, :tokens]
      out["positions"][s, at:at + tokens] = source["positions"][i, :tokens]
      out["segments"][s, at:at + tokens] = slot + 1
      out["grids"][s, slot] = source["grid"][i]
      out["label"][s, slot] = source["label"][i]
      out["mask"][s, slot] = 1.0
      used[s] += tokens
      filled[s] += 1
      return True

    real = images["mask"] > 0
    out["broken"][0] = np.count_nonzero(~real)
    no_room = [i for i in np.flatnonzero(real) if not place(images, i)]
    if self.left_over is not None:
      out["dropped"][0] = sum(
          not place(self.left_over, i)
          for i in range(len(self.left_over["tokens"])))
    self.left_over = {key: value[no_room] for key, value in images.items()}
    return out


def packed(batches, num_shares, sequences, packing, skip_first=False):
  """The packed batches (module docstring) of a process's per-image
  `batches` (pipeline.train_dataset's with `packing`, each the process's
  `num_shares` blocks of the step's image batch, concatenated), each
  block into `sequences` sequences of its own. `skip_first`: pack the
  first batch only for its left-over images (a resumed run's step
  before its first)."""
  shares = [_Share(sequences, packing) for _ in range(num_shares)]
  for batch in batches:
    rows = len(batch["label"]) // num_shares
    blocks = [share.pack({key: value[j * rows:(j + 1) * rows]
                          for key, value in batch.items()})
              for j, share in enumerate(shares)]
    if skip_first:
      skip_first = False
      continue
    yield {key: np.concatenate([block[key] for block in blocks])
           for key in blocks[0]}
