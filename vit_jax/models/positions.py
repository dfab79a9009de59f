"""Position embeddings added to the tokens (Appendix D.4): a learned table,
learned row and column tables, fixed sines and cosines, or none. RoPE,
which turns queries and keys instead, is models/rope.py."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax import errors
from vit_jax.models import layers, naflex


def sincos2d_table(rows, cols, width, temperature=10_000.0):
  """[rows * cols, width] fixed embeddings, row-major over the patch grid
  (`sincos2d`'s)."""
  row, col = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
  return sincos2d(row.reshape(-1), col.reshape(-1), width, temperature,
                  xp=np).astype(np.float32)


def sincos2d(row, col, width, temperature=10_000.0, xp=jnp):
  """[..., width] fixed embeddings of patches at (row, col): sines and
  cosines of the row index, then of the column index, at width/4
  geometrically spaced frequencies each. `xp`: numpy or jax.numpy."""
  if width % 4:
    raise errors.InputError(
        f"posemb 'sincos2d' needs a hidden_size divisible by 4, "
        f"got {width}")
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))
  angles = [xp.asarray(index)[..., None] * omega for index in (row, col)]
  return xp.concatenate([f(a) for a in angles for f in (xp.sin, xp.cos)],
                        axis=-1)


def grid_side(num_patches, what="the patches"):
  """g for a square g x g grid of `num_patches`; an InputError naming `what`
  holds them otherwise."""
  side = int(round(np.sqrt(num_patches)))
  if side * side != num_patches:
    raise errors.InputError(
        f"{what}: {num_patches} patch positions do not form a "
        "square grid")
  return side


class AddPositionEmbedding(nn.Module):
  """The values of `tokens` (models/tokens.py) with position embeddings
  added: each slot's extra (class and distillation) tokens, then the
  patches.

  kind (Appendix D.4):
    "learn": one learned [1, tokens, D] table, as in the released models.
    "learn2d": a learned row table [rows, D/2] and column table
      [cols, D - D/2]; a patch's embedding is its row's and its column's,
      concatenated. Each extra token has its own learned vector.
    "sincos2d": fixed, `sincos2d_table`; zero for the extra tokens.
    "none": nothing is added.

  The tables are made at the batch's grid (`tokens.grid`). Where each
  image has a grid of its own (a NaFlex or packed batch), the learned
  tables, made at a square image size, are resized to each image's grid
  (naflex.position_weights), and "sincos2d" is computed at each patch's
  place.
  """
  kind: str = "learn"
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    x = tokens.values
    if self.kind == "none":
      return x
    if tokens.grid is None:
      return x + self._resized(tokens).astype(x.dtype)
    _, length, width = x.shape
    init = nn.initializers.normal(stddev=0.02)
    if self.kind == "learn":
      posemb = self.param("pos_embedding",
                          layers.init(init, (None, None, "embed")),
                          (1, length, width), self.param_dtype)
      return x + posemb.astype(x.dtype)
    rows, cols = tokens.grid
    extra = length - rows * cols
    if self.kind == "learn2d":
      # Tiny tables, replicated on every device.
      row = self.param("row_embedding", layers.init(init, (None, None)),
                       (rows, width // 2), self.param_dtype)
      col = self.param("col_embedding", layers.init(init, (None, None)),
                       (cols, width - width // 2), self.param_dtype)
      table = jnp.concatenate([
          jnp.broadcast_to(row[:, None], (rows, cols, row.shape[-1])),
          jnp.broadcast_to(col[None], (rows, cols, col.shape[-1]))],
                              axis=-1).reshape(rows * cols, width)
      token = (self.param("token_embedding", layers.init(init, (None, None)),
                          (extra, width), self.param_dtype) if extra
               else jnp.zeros((0, width), table.dtype))
    else:  # "sincos2d"
      table = jnp.asarray(sincos2d_table(rows, cols, width))
      token = jnp.zeros((extra, width), table.dtype)
    posemb = jnp.concatenate([token.astype(table.dtype), table])
    return x + posemb[None].astype(x.dtype)

  def _resized(self, tokens):
    """[N, tokens, D] float32 embeddings of tokens whose images each have
    their own grid: each slot's extra tokens, then the patches, each at
    its place in its image's grid."""
    n, _, width = tokens.values.shape
    extra, slots = tokens.prefix_tokens, tokens.images_per_row
    rows, cols = tokens.rows, tokens.cols
    if self.kind == "sincos2d":
      patches = sincos2d(rows, cols, width)
      token = jnp.zeros((extra, width))
    elif self.kind == "learn":
      table = self._trained("pos_embedding", (None, None, "embed"))[0]
      side = grid_side(table.shape[0] - extra,
                       "the position table a NaFlex batch resizes")
      token, square = table[:extra], table[extra:]
      # Each patch's weight on every entry of the table, [N, L, side^2],
      # then one matmul, so that XLA:CPU builds no [N, L, side, D]
      # intermediate (docs/naflex.md).
      weights = (naflex.position_weights(rows, tokens.grid_rows, side)[
          ..., None] * naflex.position_weights(cols, tokens.grid_cols, side)[
              ..., None, :])
      patches = weights.reshape(n, -1, side * side) @ square
    else:  # "learn2d"
      row, col = (self._trained(f"{name}_embedding", (None, None))
                  for name in ("row", "col"))
      patches = jnp.concatenate([
          naflex.position_weights(rows, tokens.grid_rows, row.shape[0]) @ row,
          naflex.position_weights(cols, tokens.grid_cols, col.shape[0])
          @ col], axis=-1)
      token = (self._trained("token_embedding", (None, None))
               if extra else jnp.zeros((0, width)))
    token = jnp.broadcast_to(jnp.tile(token.astype(jnp.float32), (slots, 1)),
                             (n, slots * extra, width))
    return jnp.concatenate([token, patches.astype(jnp.float32)], axis=1)

  def _trained(self, name, axes):
    """A learned table as float32, at the shape its params already have: a
    NaFlex batch cannot say what size it was made at."""
    existing = self.get_variable("params", name)
    if existing is None:
      raise errors.InputError(
          f"a NaFlex batch resizes the position table {name!r}, which the "
          "params lack: initialise the model with square images (the run's "
          "image_size), then apply it to patches")
    shape = np.shape(nn.meta.unbox(existing))
    return self.param(name, layers.init(nn.initializers.zeros, axes), shape,
                      self.param_dtype).astype(jnp.float32)
