"""NaFlex: each image seen at its own aspect ratio, as a sequence of
patches within a budget (SigLIP 2's NaFlex variants; docs/naflex.md).

An image of height H and width W is resized, keeping its aspect ratio, to
the largest grid of rows x cols patches whose count is within the budget
`max_num_patches` (`grid_for`), cut into patches row-major, and padded
with empty patches to the budget (data/preprocess.py's `naflex_patches`,
in the input pipeline). A batch of them is a
`Patches`: the model embeds each patch as its convolution would, resizes its
learned position table to each image's grid (`position_weights`), and keeps
the padding out of attention and out of what its head pools.

Several images may share a sequence instead (`Packed`, NaViT's Patch n'
Pack): each at its own grid, attending to its own tokens, pooled alone.

The grid rule (host-side) and the weights of the position table's resize
(device-side) live here together: both are the model's reading of an
image, and the data wing, which calls the rule, is above this floor.
"""

import math
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from vit_jax import errors


class Patches(NamedTuple):
  """A NaFlex batch, what VisionTransformer takes in place of images.

  pixels: [N, L, p * p * 3], each image's rows * cols patches first (row
    by row; each patch flattened as row in patch, column in patch, channel,
    as SigLIP 2's image processor flattens it), then padding up to L; uint8,
    or floats in [-1, 1].
  grid: [N, 2] int32, each image's (rows, cols) of patches; (0, 0) for a
    row of the batch that holds no image.
  """
  pixels: jax.Array
  grid: jax.Array


class Packed(NamedTuple):
  """Several images in each sequence (NaViT's Patch n' Pack), what
  VisionTransformer takes in place of images: each image at its own grid,
  its patches row-major and contiguous, its tokens attending to its own
  alone; the logits are [N, K, classes], one row per slot.

  pixels: [N, L, p * p * 3], as Patches' (uint8, or floats in [-1, 1]).
  segments: [N, L] int32: the slot (1 .. K) of the image each patch is
    of; 0 for padding.
  positions: [N, L, 2] int32: each patch's (row, col) in its image's grid.
  grids: [N, K, 2] int32: each slot's image's (rows, cols); (0, 0) for a
    slot that holds none (its logits are the model's on no patches:
    finite, and a loss gives them no weight).
  """
  pixels: jax.Array
  segments: jax.Array
  positions: jax.Array
  grids: jax.Array

  @property
  def slots(self):
    return self.grids.shape[1]


class Segments(NamedTuple):
  """Attention's mask of a packed sequence, each token attending to the
  tokens of its own segment: the splash kernel takes the ids as they are,
  the einsum and XLA's attention their [N, T, T] comparison (`dense`)."""
  ids: jax.Array  # [N, T] int32, >= 0

  def dense(self):
    """[N, T, T] bool: whether token q may attend to token k."""
    return self.ids[:, :, None] == self.ids[:, None, :]


def patch_mask(grid, length):
  """[N, length] bool: which of each image's tokens are its real patches
  (the first rows * cols)."""
  count = grid[:, 0] * grid[:, 1]
  return jnp.arange(length)[None] < count[:, None]


def patch_positions(grid, length):
  """(rows [N, length], cols [N, length]) int32: each patch's place in its
  image's grid; 0 for padding, so that no padding token's embedding is
  undefined."""
  cols = jnp.maximum(grid[:, 1:2], 1)
  index = jnp.arange(length)[None]
  real = patch_mask(grid, length)
  return (jnp.where(real, index // cols, 0), jnp.where(real, index % cols, 0))


def position_weights(index, size, table_size):
  """[..., table_size] float32: how much each entry of a learned position
  table of `table_size` along one axis gives position `index` of `size`,
  when the table is resized to `size` bilinearly with antialiasing (a
  triangle filter widened by the shrink factor when shrinking; torch's
  `interpolate(mode="bilinear", antialias=True, align_corners=False)`,
  which SigLIP 2 resizes with). `index` and `size` may differ per image
  (arrays of the same shape)."""
  size = jnp.maximum(jnp.asarray(size, jnp.float32), 1.0)
  centre = (jnp.asarray(index, jnp.float32) + 0.5) * table_size / size
  # The filter's reach in table entries: 1 when growing, the shrink factor
  # when shrinking (the antialiasing).
  reach = jnp.maximum(table_size / size, 1.0)
  distance = jnp.abs(jnp.arange(table_size) + 0.5 - centre[..., None])
  weights = jnp.maximum(1.0 - distance / reach[..., None], 0.0)
  return weights / weights.sum(-1, keepdims=True)


# The processor's search for the largest scale: transformers'
# Siglip2ImageProcessor bisects over [EPS / 10, 100] until the interval is
# narrower than EPS; the same search gives the same grids.
EPS = 1e-5


def grid_for(height, width, patch_size, max_num_patches):
  """(rows, cols): the grid of patches that an image of height x width is
  resized to, the largest that keeps its aspect ratio within
  `max_num_patches` patches (SigLIP 2's image processor's rule: each side
  scaled by one factor and rounded up to whole patches, at least one)."""
  if min(height, width, patch_size, max_num_patches) < 1:
    raise errors.InputError(
        f"an image of {height}x{width} at patch size {patch_size} and "
        f"max_num_patches {max_num_patches}: each must be at least 1")

  def sides(scale):
    return tuple(max(1, math.ceil(side * scale / patch_size))
                 for side in (height, width))

  low, high = EPS / 10, 100.0
  while high - low >= EPS:
    middle = (low + high) / 2
    rows, cols = sides(middle)
    if rows * cols <= max_num_patches:
      low = middle
    else:
      high = middle
  return sides(low)


def native_grid(height, width, patch_size, max_num_patches, scale=1.0):
  """(rows, cols): the grid of an image of height x width read at its own
  size, scaled by `scale` (a sampled resolution's), each side rounded up
  to whole patches; shrunk to grid_for's only where that many patches
  exceed `max_num_patches` (a packed sequence's length). NaViT's reading:
  no image is enlarged to fill the sequence."""
  rows, cols = (max(1, math.ceil(side * scale / patch_size))
                for side in (height, width))
  if rows * cols <= max_num_patches:
    return rows, cols
  return grid_for(height, width, patch_size, max_num_patches)


class Budget(NamedTuple):
  """How a NaFlex run cuts its images: patches of patch_size pixels, at
  most max_num_patches of them an image (config.naflex.max_num_patches);
  each image enlarged or shrunk to fill the budget (`fill`, grid_for), or
  read at its own size and only shrunk to fit (native_grid: a packed
  run's)."""
  patch_size: int
  max_num_patches: int
  fill: bool = True

  @property
  def patch_values(self):
    return self.patch_size ** 2 * 3


def attention_bytes(config, max_num_patches):
  """The bytes one image's attention takes in one layer under the budget
  `max_num_patches`: its float32 logits and their softmax, every head,
  every token (the patches, the class and distillation tokens and the
  registers)."""
  tokens = max_num_patches + config.num_prefix_tokens
  return 2 * 4 * config.num_heads * tokens ** 2


def device_memory_bytes(device=None):
  """The memory of `device` (default: the first): what its allocator may
  use, or, for a CPU, which reports none, the host's; None where it cannot
  be told (a device a plan compiles for, which no allocator serves)."""
  device = device or jax.devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    stats = {}  # Each PJRT client refuses its own way.
  if "bytes_limit" in stats:
    return stats["bytes_limit"]
  if device.platform == "cpu":
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return None


def check_budget(config, max_num_patches, flag="--max_num_patches",
                 images=1, smaller="a smaller budget (SigLIP 2 reads up to "
                 "1024)", device=None):
  """Refuses a budget under which the attention of `images` images (one
  `device`'s, default the first) in one layer cannot fit the device,
  before anything is allocated (XLA would ask for it all and fail in a
  traceback). `smaller`: what to give instead. A device whose memory
  cannot be told (a plan's) is left to the compiler."""
  needed, memory = images * attention_bytes(config, max_num_patches), (
      device_memory_bytes(device))
  if memory is not None and needed > memory:
    whose = "one image's" if images == 1 else f"{images} images'"
    raise errors.InputError(
        f"{flag}={max_num_patches}: {whose} attention alone would take "
        f"{needed / 1e9:,.0f} GB ({config.num_heads} heads x "
        f"{max_num_patches:,} patches squared, float32), more than the "
        f"device's {memory / 1e9:,.0f} GB; give {smaller}")


def budget_of(max_num_patches, model, packing=False):
  """The Budget of a run whose config.naflex.max_num_patches is
  `max_num_patches` (0: not NaFlex, None) and whose model is `model`;
  `packing`: config.naflex.packing, whose images are read at their own
  size."""
  if not max_num_patches:
    return None
  return Budget(model.config.patch_size, max_num_patches, fill=not packing)


def inputs_of(batch):
  """What the model takes of an input pipeline's batch: its "image", or,
  where the batch has each image's "grid", a NaFlex batch of them, or,
  where it has "segments", a packed one (data/packing.py's)."""
  if "segments" in batch:
    return Packed(batch["image"], batch["segments"], batch["positions"],
                  batch["grids"])
  if "grid" in batch:
    return Patches(batch["image"], batch["grid"])
  return batch["image"]
