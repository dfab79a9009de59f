"""2-D rotary position embeddings (RoPE) of the patch tokens: no table, so
a model reads any grid.

A head of width Dh is rotated in Dh / 2 planes, each pairing channel j
with channel j + Dh / 2. Only the patches' queries and keys turn; the
class token and registers do not. The kinds:

- "axial", as DINOv3 computes it. Each patch's centre is placed in
  [-1, 1] along each axis of its own image's grid: (row + 0.5) / rows * 2
  - 1, and likewise for the column. The first Dh / 4 planes turn with the
  row coordinate, the next Dh / 4 with the column, at angles
  2 pi * coordinate / period, the periods `theta ** (4 i / Dh)` for
  i = 0 .. Dh / 4 - 1 (1 up to just below theta).
- "index", as timm's RoPE ViTs compute it (`vit_*_rope_*`, its "cat"
  kind): the same planes and periods, but the coordinates are the patch's
  row and column indices and the angles coordinate / period.
- "mixed", timm's `rope_mixed`: every block has learned frequencies per
  head and plane for the column and the row index (`rope_freqs` [2, heads,
  Dh / 2]); a plane turns by col * f_x + row * f_y.

In training, the coordinates may be augmented per image, as DINOv3 trains:
shifted by a uniform draw in [-shift, shift] per axis, scaled by a
log-uniform draw in [1 / jitter, jitter] per axis, and scaled by one
log-uniform draw in [1 / rescale, rescale] for both axes.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors

KINDS = ("", "axial", "index", "mixed")


class Augmentation(NamedTuple):
  """The training draws of the coordinates (module docstring); None: none."""
  shift: Optional[float] = None
  jitter: Optional[float] = None
  rescale: Optional[float] = None

  @property
  def any(self):
    return any(value is not None for value in self)


def check(kind, head_dim):
  """InputError unless heads `head_dim` wide can turn by RoPE `kind` (one
  of KINDS, which config.py's declaration checks)."""
  if kind and head_dim % 4:
    raise errors.InputError(
        f"rope {kind!r} turns each head in planes of the row and the column: "
        f"it needs a head width (hidden_size / num_heads) divisible by 4, "
        f"got {head_dim}")


def coordinates(rows, cols, grid_rows, grid_cols, kind="axial"):
  """[..., 2] float32: each patch's (row, column) coordinates: "axial", its
  centre in [-1, 1] of its grid; "index" and "mixed", its indices. rows,
  cols: its place; grid_rows, grid_cols: the grid's size (broadcast with
  them)."""
  def centre(index, size):
    if kind != "axial":
      return jnp.asarray(index, jnp.float32)
    size = jnp.maximum(jnp.asarray(size, jnp.float32), 1.0)
    return (jnp.asarray(index, jnp.float32) + 0.5) / size * 2 - 1
  return jnp.stack([centre(rows, grid_rows), centre(cols, grid_cols)], -1)


def augment(coords, augmentation, rng, images=None, count=1):
  """coords [N, L, 2] moved by one draw per image (module docstring): per
  row, or with `images` [N, L] (each patch's image in its row, 0 ..
  count - 1: a packed sequence's) per image of each row."""
  n = coords.shape[0]
  shift_rng, jitter_rng, rescale_rng = jax.random.split(rng, 3)

  def draw(rng, shape, low, high):
    """[n, count, shape] draws, as each patch takes its image's."""
    draws = jax.random.uniform(rng, (n, count, shape), minval=low,
                               maxval=high)
    if images is None:
      return draws
    return jnp.take_along_axis(draws, images[..., None], axis=1)

  def log_uniform(rng, shape, limit):
    span = np.log(limit)
    return jnp.exp(draw(rng, shape, -span, span))

  if augmentation.shift is not None:
    coords = coords + draw(shift_rng, 2, -augmentation.shift,
                           augmentation.shift)
  if augmentation.jitter is not None:
    coords = coords * log_uniform(jitter_rng, 2, augmentation.jitter)
  if augmentation.rescale is not None:
    coords = coords * log_uniform(rescale_rng, 1, augmentation.rescale)
  return coords


def angles(coords, head_dim, theta, kind="axial"):
  """[..., L, head_dim / 2] float32 rotation angles of patches at `coords`
  [..., L, 2] ("axial" or "index"): the row's planes, then the column's."""
  periods = theta ** (np.arange(head_dim // 4) * 4 / head_dim)
  turn = 2 * np.pi if kind == "axial" else 1.0
  frequencies = jnp.asarray(turn / periods, jnp.float32)
  return jnp.concatenate([coords[..., :1] * frequencies,
                          coords[..., 1:] * frequencies], axis=-1)


def mixed_angles(coords, frequencies):
  """[..., L, heads, Dh / 2] float32 angles of "mixed" RoPE: patches at
  index `coords` [..., L, 2] (row, column), a block's `frequencies` [2,
  heads, Dh / 2] (the column's, then the row's)."""
  frequencies = frequencies.astype(jnp.float32)
  return (coords[..., 1, None, None] * frequencies[0]
          + coords[..., 0, None, None] * frequencies[1])


def init_mixed(rng, shape, dtype=jnp.float32, *, theta):
  """"mixed" RoPE's initial frequencies [2, heads, Dh / 2], as timm draws
  them: per head, the magnitudes 1 / theta ** (4 i / Dh) (i < Dh / 4) along
  a random direction, and the same turned by a right angle."""
  _, heads, half = shape
  magnitudes = 1 / theta ** (np.arange(half // 2) * 4 / (2 * half))
  direction = jax.random.uniform(rng, (heads, 1), maxval=2 * np.pi)
  fx = jnp.concatenate([magnitudes * jnp.cos(direction),
                        magnitudes * jnp.cos(direction + np.pi / 2)], -1)
  fy = jnp.concatenate([magnitudes * jnp.sin(direction),
                        magnitudes * jnp.sin(direction + np.pi / 2)], -1)
  return jnp.stack([fx, fy]).astype(dtype)


def rotate(x, patch_angles):
  """x [N, tokens, heads, Dh] with its last L tokens, the patches, turned by
  `patch_angles`, [N or 1, L, Dh / 2] or per head [N or 1, L, heads,
  Dh / 2]; the tokens before them as they are."""
  num_patches = patch_angles.shape[1]
  prefix, patches = x[:, :-num_patches], x[:, -num_patches:]
  if patch_angles.ndim == 3:  # The same for every head.
    patch_angles = patch_angles[:, :, None]
  cos = jnp.cos(patch_angles).astype(x.dtype)
  sin = jnp.sin(patch_angles).astype(x.dtype)
  first, second = jnp.split(patches, 2, axis=-1)
  turned = jnp.concatenate([first * cos - second * sin,
                            second * cos + first * sin], axis=-1)
  return jnp.concatenate([prefix, turned], axis=1)
