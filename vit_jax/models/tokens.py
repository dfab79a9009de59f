"""One batch of tokens, whatever form its images came in: what every layer
after the patch embedding reads.

The model takes three forms of input: images (one grid of patches for the
whole batch), a NaFlex batch (naflex.Patches: each image at its own grid,
padded to a common length) and a packed one (naflex.Packed: several
images a sequence, each in a slot of its own). ImageEncoder embeds each
and describes it once, as `Tokens`; the position embedding, RoPE, the
attention and the heads read that description and not the form.
"""

from typing import Any, Optional

import flax.struct
import jax.numpy as jnp
import numpy as np

from vit_jax.models import naflex


@flax.struct.dataclass
class Tokens:
  """A batch of tokens and where each stands.

  values: [N, T, D]: each slot's prefix tokens (the class and distillation
    tokens; once the Encoder has added them, then each slot's registers),
    then the L patches.
  rows, cols: [N or 1, L] int: each patch's place in its image's grid; 0
    for padding.
  grid_rows, grid_cols: the size of each patch's image's grid, broadcast
    with rows: [N, L], [N, 1], or Python ints for a batch of one grid.
  attention_mask: which keys each token of the blocks' sequence (prefix
    tokens, registers, patches) may attend to, in Attention's forms: None,
    all; [N, tokens] bool, a NaFlex batch's real tokens; naflex.Segments,
    a packed sequence's images.
  pool_mask: the patches that a head pools: None, all; [N, L] bool, each
    row's image's real ones; [N, K, L] bool, each slot's image's.
  segments: [N, L] int32: the slot (1 .. K) of each patch's image, 0 for
    padding; None: one image a row.
  slots: K, the images a packed sequence holds, each read to a row of its
    own ([N, K, ...]); None: one image a row ([N, ...]).
  grid: (rows, cols) of a batch of one grid, where the position tables are
    made; None: each image has its own, and the learned tables, made at a
    square image size, are resized to it.
  """
  values: Any
  rows: Any
  cols: Any
  grid_rows: Any
  grid_cols: Any
  attention_mask: Any = None
  pool_mask: Any = None
  segments: Any = None
  slots: Optional[int] = flax.struct.field(pytree_node=False, default=None)
  grid: Optional[tuple] = flax.struct.field(pytree_node=False, default=None)

  @property
  def images_per_row(self):
    return self.slots or 1

  @property
  def num_patches(self):
    return self.rows.shape[-1]

  @property
  def prefix_tokens(self):
    """Each slot's tokens before the patches."""
    return (self.values.shape[1] - self.num_patches) // self.images_per_row

  @property
  def patches(self):
    """[N, L, D]: the patches' tokens, which come last."""
    return self.values[:, self.values.shape[1] - self.num_patches:]

  @property
  def patch_images(self):
    """[N, L] int32: each patch's image's place in its row (0 .. K - 1;
    padding 0); None: one image a row."""
    if self.segments is None:
      return None
    return jnp.maximum(self.segments - 1, 0)


def of_grid(values, grid):
  """Tokens of images' embedded patches [N, rows * cols, D], row-major
  over `grid` (rows, cols), every image's. The places are constants, as
  the position tables made at the grid are."""
  rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]),
                           indexing="ij")
  return Tokens(values, rows.reshape(1, -1), cols.reshape(1, -1), grid[0],
                grid[1], grid=tuple(grid))


def of_patches(values, patches, prefix_tokens, registers):
  """Tokens of a NaFlex batch's (naflex.Patches) embedded patches [N, L,
  D], whose blocks will see `prefix_tokens` and `registers` before them."""
  n, length, _ = values.shape
  rows, cols = naflex.patch_positions(patches.grid, length)
  real = naflex.patch_mask(patches.grid, length)
  return Tokens(
      values, rows, cols, patches.grid[:, :1], patches.grid[:, 1:],
      attention_mask=jnp.concatenate(
          [jnp.ones((n, prefix_tokens + registers), bool), real], axis=1),
      pool_mask=real)


def of_packed(values, packed, prefix_tokens, registers):
  """Tokens of a packed batch's (naflex.Packed) embedded patches [N, L, D],
  whose blocks will see each slot's `prefix_tokens`, then each slot's
  `registers`, before them: each token attends to its own slot's; padding
  to padding, which no image reads."""
  segments, slots = packed.segments, packed.slots
  # Padding's grid is (1, 1), so that no padding token's place is undefined.
  grids = jnp.take_along_axis(
      packed.grids, jnp.maximum(segments - 1, 0)[..., None], axis=1)
  grids = jnp.where(segments[..., None] > 0, grids, 1)
  ids = jnp.arange(1, slots + 1, dtype=jnp.int32)
  prefix = [jnp.broadcast_to(jnp.repeat(ids, count),
                             (segments.shape[0], count * slots))
            for count in (prefix_tokens, registers)]
  return Tokens(
      values, packed.positions[..., 0], packed.positions[..., 1],
      grids[..., 0], grids[..., 1],
      attention_mask=naflex.Segments(jnp.concatenate(prefix + [segments],
                                                     axis=1)),
      pool_mask=segments[:, None, :] == ids[:, None], segments=segments,
      slots=slots)


def visible(tokens, keep, valid=None):
  """The Tokens of one grid's patches (`of_grid`'s, before any prefix
  token), or of a NaFlex batch's (`of_patches`'), that `keep` [N, K] int
  names, each image its own K: their values gathered, each at its place
  in its grid. The grid is no longer the batch's (grid None), so the
  position tables are computed, or resized, at each kept patch's place, as
  a NaFlex batch's are (a table resized to its own size is the table
  itself, to the bit). `valid` [N, K] bool: those of the K that count, the
  rest (a NaFlex image that keeps fewer) neither attended to nor pooled."""
  rows = jnp.take_along_axis(jnp.broadcast_to(tokens.rows, keep.shape[:1]
                                              + tokens.rows.shape[1:]),
                             keep, axis=1)
  cols = jnp.take_along_axis(jnp.broadcast_to(tokens.cols, keep.shape[:1]
                                              + tokens.cols.shape[1:]),
                             keep, axis=1)
  values = jnp.take_along_axis(tokens.values, keep[..., None], axis=1)
  if valid is None:
    return Tokens(values, rows, cols, tokens.grid_rows, tokens.grid_cols)
  mask = tokens.attention_mask
  prefix = mask.shape[1] - tokens.num_patches
  real = jnp.take_along_axis(mask[:, prefix:], keep, axis=1) & valid
  return Tokens(values, rows, cols, tokens.grid_rows, tokens.grid_cols,
                attention_mask=jnp.concatenate([mask[:, :prefix], real],
                                               axis=1),
                pool_mask=real)

