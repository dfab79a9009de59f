"""2-D rotary position embeddings (RoPE) of the patch tokens, as DINOv3
computes them ("axial"): no table, so a model reads any grid.

Each patch's centre is placed in [-1, 1] along each axis of its own image's
grid: (row + 0.5) / rows * 2 - 1, and likewise for the column. A head of
width Dh is rotated in Dh / 2 planes, each pairing channel j with channel
j + Dh / 2: the first Dh / 4 planes turn with the row coordinate, the next
Dh / 4 with the column, at angles 2 pi * coordinate / period, the periods
`theta ** (4 i / Dh)` for i = 0 .. Dh / 4 - 1 (1 up to just below theta).
Only the patches' queries and keys turn; the class token and registers do
not.

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

KINDS = ("", "axial")


class Augmentation(NamedTuple):
  """The training draws of the coordinates (module docstring); None: none."""
  shift: Optional[float] = None
  jitter: Optional[float] = None
  rescale: Optional[float] = None

  @property
  def any(self):
    return any(value is not None for value in self)


def check(kind, head_dim):
  if kind not in KINDS:
    raise errors.InputError(f"rope must be one of {KINDS}, got {kind!r}")
  if kind and head_dim % 4:
    raise errors.InputError(
        f"rope {kind!r} turns each head in planes of the row and the column: "
        f"it needs a head width (hidden_size / num_heads) divisible by 4, "
        f"got {head_dim}")


def coordinates(rows, cols, grid_rows, grid_cols):
  """[..., 2] float32: each patch's centre (row, column) in [-1, 1] of its
  grid. rows, cols: its place; grid_rows, grid_cols: the grid's size
  (broadcast with them)."""
  def centre(index, size):
    size = jnp.maximum(jnp.asarray(size, jnp.float32), 1.0)
    return (jnp.asarray(index, jnp.float32) + 0.5) / size * 2 - 1
  return jnp.stack([centre(rows, grid_rows), centre(cols, grid_cols)], -1)


def augment(coords, augmentation, rng):
  """coords [N, L, 2] moved by one draw per image (module docstring)."""
  n = coords.shape[0]
  shift_rng, jitter_rng, rescale_rng = jax.random.split(rng, 3)

  def log_uniform(rng, shape, limit):
    span = np.log(limit)
    return jnp.exp(jax.random.uniform(rng, shape, minval=-span, maxval=span))

  if augmentation.shift is not None:
    coords = coords + jax.random.uniform(
        shift_rng, (n, 1, 2), minval=-augmentation.shift,
        maxval=augmentation.shift)
  if augmentation.jitter is not None:
    coords = coords * log_uniform(jitter_rng, (n, 1, 2), augmentation.jitter)
  if augmentation.rescale is not None:
    coords = coords * log_uniform(rescale_rng, (n, 1, 1),
                                  augmentation.rescale)
  return coords


def angles(coords, head_dim, theta):
  """[..., L, head_dim / 2] float32 rotation angles of patches at `coords`
  [..., L, 2]: the row's planes, then the column's."""
  periods = theta ** (np.arange(head_dim // 4) * 4 / head_dim)
  frequencies = jnp.asarray(2 * np.pi / periods, jnp.float32)
  return jnp.concatenate([coords[..., :1] * frequencies,
                          coords[..., 1:] * frequencies], axis=-1)


def rotate(x, patch_angles):
  """x [N, tokens, heads, Dh] with its last L tokens, the patches, turned by
  `patch_angles` [N or 1, L, Dh / 2]; the tokens before them as they
  are."""
  num_patches = patch_angles.shape[-2]
  prefix, patches = x[:, :-num_patches], x[:, -num_patches:]
  cos = jnp.cos(patch_angles)[:, :, None].astype(x.dtype)
  sin = jnp.sin(patch_angles)[:, :, None].astype(x.dtype)
  first, second = jnp.split(patches, 2, axis=-1)
  turned = jnp.concatenate([first * cos - second * sin,
                            second * cos + first * sin], axis=-1)
  return jnp.concatenate([prefix, turned], axis=1)
