"""Masked patch prediction, the paper's self-supervised objective (Section
4.6, Appendix B.1.2).

Half of each image's patch embeddings are corrupted: of those, 80% are
replaced by a learned [mask] embedding, 10% by the embedding of another
patch of the same image, and 10% are left as they are. The model then
predicts, for every corrupted patch, its mean colour in 3 bits per channel:
one of 512 classes. A model with `mpp=True` (configs/mpp.py) has the mask
embedding and a 512-way head on every patch token; its encoder fine-tunes
like any other through `init_from`, which drops both.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

CORRUPTED = 0.5
MASKED, REPLACED = 0.8, 0.1  # Of the corrupted; the rest stay as they are.
BITS = 3
NUM_CLASSES = 2 ** (3 * BITS)


class Corruption(NamedTuple):
  """Per image and patch: `source`, the patch whose embedding it takes (its
  own unless replaced), `masked`, whether the [mask] embedding takes its
  place, and `corrupted`, whether it is one the loss counts."""
  source: jax.Array
  masked: jax.Array
  corrupted: jax.Array


def corrupt(key, num_images, num_patches):
  """A random Corruption: exactly half the patches of each image (rounded
  down), each then masked (80%), replaced by another patch (10%) or kept."""
  rank_key, kind_key, other_key = jax.random.split(key, 3)
  ranks = jnp.argsort(jnp.argsort(
      jax.random.uniform(rank_key, (num_images, num_patches)), axis=1), axis=1)
  corrupted = ranks < int(num_patches * CORRUPTED)
  kind = jax.random.uniform(kind_key, (num_images, num_patches))
  masked = corrupted & (kind < MASKED)
  replaced = corrupted & (kind >= MASKED) & (kind < MASKED + REPLACED)
  own = jnp.broadcast_to(jnp.arange(num_patches), (num_images, num_patches))
  # Another patch: an offset of 1 .. num_patches - 1, so never its own.
  offset = jax.random.randint(other_key, (num_images, num_patches), 1,
                              max(num_patches, 2))
  source = jnp.where(replaced, (own + offset) % num_patches, own)
  return Corruption(source, masked, corrupted)


def apply(corruption, embeddings, mask_embedding):
  """embeddings [N, patches, D] with the corruption applied."""
  moved = jnp.take_along_axis(embeddings, corruption.source[..., None], axis=1)
  return jnp.where(corruption.masked[..., None],
                   mask_embedding.astype(embeddings.dtype), moved)


def targets(images, patch):
  """[N, patches] classes: each patch's mean colour, 3 bits a channel, as
  red * 64 + green * 8 + blue. Images are uint8, or floats in [-1, 1]."""
  if images.dtype == jnp.uint8:
    images = images.astype(jnp.float32) / 255
  else:
    images = (images.astype(jnp.float32) + 1) / 2
  n, h, w, c = images.shape
  means = images.reshape(n, h // patch, patch, w // patch, patch, c).mean(
      axis=(2, 4)).reshape(n, -1, c)
  levels = jnp.clip(jnp.floor(means * 2**BITS), 0, 2**BITS - 1).astype(
      jnp.int32)
  return (levels[..., 0] * 2 ** (2 * BITS) + levels[..., 1] * 2**BITS
          + levels[..., 2])
