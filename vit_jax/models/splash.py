"""Attention through Pallas's splash attention kernel, model.attention
"splash": on TPUs a fused kernel that never writes the [heads, tokens,
tokens] logits and weights to HBM, where the einsum writes them and reads
them back in the forward and again in the backward pass (docs/plan.md).

The kernel works on whole tiles of BLOCK tokens, so the tokens are padded
to a multiple of BLOCK; the padding, and a NaFlex batch's padding patches,
are a segment of their own, which no real token attends to. A packed
sequence's images are segments too, each attending to its own. The kernel sees
one device's examples and heads: under a mesh (training, evaluation) it
runs in a shard_map over the batch and head axes that sharding.py's table
gives. Elsewhere than on a TPU, Pallas interprets it: the same function,
slowly, for the tests.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as kernels,
    splash_attention_mask as masks,
)

from vit_jax import sharding
from vit_jax.models import naflex

# The kernel's default tile, in tokens, for queries and keys alike.
BLOCK = 128


def padded_tokens(tokens):
  """How many tokens the kernel computes for `tokens`: the next multiple of
  BLOCK."""
  return -(-tokens // BLOCK) * BLOCK


def attention(query, keys, values, mask=None):
  """softmax(q.k / sqrt(head_dim)) . v of [N, tokens, heads, head_dim]
  inputs (self-attention: as many keys as queries), in [N, tokens, heads,
  head_dim]; the softmax in float32. `mask` [N, tokens] bool: the keys that
  may be attended to (NaFlex's real tokens); or a naflex.Segments, each
  token attending to its own segment's (a packed sequence's images); or
  None for all."""
  n, tokens, _, head_dim = query.shape
  padded = padded_tokens(tokens)
  # Every mask as segment ids: the real tokens 0 and the masked 1, or a
  # packed sequence's own; the kernel's padding a segment of its own.
  if mask is None:
    ids = jnp.zeros((n, tokens), jnp.int32)
  elif isinstance(mask, naflex.Segments):
    ids = mask.ids
  else:
    ids = jnp.where(mask, 0, 1)
  segments = jnp.pad(ids.astype(jnp.int32), [(0, 0), (0, padded - tokens)],
                     constant_values=-1)

  def heads_first(x):
    x = jnp.pad(x, [(0, 0), (0, padded - tokens), (0, 0), (0, 0)])
    return jnp.swapaxes(x, 1, 2)  # [N, heads, padded, head_dim]

  # The kernel does not scale the logits.
  query = query * jnp.asarray(head_dim ** -0.5, query.dtype)
  out = _per_device(heads_first(query), heads_first(keys),
                    heads_first(values), segments)
  return jnp.swapaxes(out, 1, 2)[:, :tokens]


def _per_device(query, keys, values, segments):
  """The kernel over each device's block of examples and heads."""

  def kernel(query, keys, values, segments):
    return jax.lax.platform_dependent(
        query, keys, values, segments,
        tpu=functools.partial(_splash, interpret=False),
        default=functools.partial(_splash, interpret=True))

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:  # One device, or no mesh: the arrays are whole.
    return kernel(query, keys, values, segments)
  heads = sharding.activation_spec(("batch", "heads", "tokens", "kv"))
  return jax.shard_map(
      kernel, in_specs=(heads, heads, heads,
                        sharding.activation_spec(("batch", "tokens"))),
      out_specs=heads, check_vma=False)(query, keys, values, segments)


def _splash(query, keys, values, segments, interpret):
  """[n, heads, tokens, head_dim] arrays, tokens a multiple of BLOCK."""
  _, heads, tokens, _ = query.shape
  mask = masks.MultiHeadMask([masks.FullMask((tokens, tokens))] * heads)
  kernel = kernels.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                   interpret=interpret)
  return jax.vmap(lambda q, k, v, s: kernel(
      q, k, v, segment_ids=kernels.SegmentIds(q=s, kv=s)))(
          query, keys, values, segments)
