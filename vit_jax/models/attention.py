"""Multi-head dot-product attention, the einsum's (whose weights the
Section 4.5 figures read) or a fused kernel's: XLA's or cuDNN's
(`_fused_attention`), or Pallas's splash (models/splash.py)."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import layers, naflex, rope as rope_lib, splash
from vit_jax.models.config import ViTConfig


class Attention(nn.Module):
  """Multi-head attention of `x`'s tokens to `kv`'s (default: `x`'s own);
  q/k/v kernels are (D, heads, D/heads). `record`: keep the weights for the
  Section 4.5 figures (the blocks' attention, not a pooling head's).
  `mask` [N, keys] bool: the keys that may be attended to (NaFlex's real
  tokens, which come first); or [N, queries, keys], the keys each query
  may attend to (a MAP probe's of a packed sequence); or a
  naflex.Segments, each token attending to its own segment's (a packed
  sequence's images, naflex.Packed); or None for all. `rope` [N or 1,
  patches, head_dim / 2]: the angles that turn the
  patches' queries and keys (the last tokens; models/rope.py); for rope
  "mixed", the patches' index coordinates [N or 1, patches, 2], which
  this block's own frequencies turn into angles; or None."""
  config: ViTConfig
  record: bool = True

  @nn.compact
  def __call__(self, x, *, train, kv=None, mask=None, rope=None):
    config = self.config
    width = x.shape[-1]
    head_dim = width // config.num_heads
    if rope is not None and config.rope == "mixed":
      frequencies = self.param(
          "rope_freqs", layers.init(functools.partial(
              rope_lib.init_mixed, theta=config.rope_theta),
                              (None, "heads", None)),
          (2, config.num_heads, head_dim // 2), jnp.float32)
      rope = rope_lib.mixed_angles(rope, frequencies)

    def project(name):
      # Without RoPE a key bias shifts each query's logits by a constant,
      # which softmax ignores; with RoPE it does not, so a model whose
      # source has none (DINOv3) must not train one.
      y = nn.DenseGeneral(
          (config.num_heads, head_dim), dtype=config.dtype,
          param_dtype=config.param_dtype,
          use_bias=name != "key" or config.key_bias,
          kernel_init=layers.init(nn.initializers.xavier_uniform(),
                            ("embed", "heads", "kv")),
          bias_init=layers.init(nn.initializers.zeros, ("heads", "kv")),
          dot_general=layers.dot_general(config),
          name=name)(x if name == "query" or kv is None else kv)
      if config.qk_norm and name != "value":
        y = nn.LayerNorm(
            epsilon=config.layer_norm_epsilon, dtype=config.dtype,
            param_dtype=config.param_dtype,
            scale_init=layers.init(nn.initializers.ones, ("kv",)),
            bias_init=layers.init(nn.initializers.zeros, ("kv",)),
            name=f"{name}_norm")(y)
      if rope is not None and name != "value":
        y = rope_lib.rotate(y, rope)
      return y

    if isinstance(mask, naflex.Segments):
      if config.attention != "splash":  # The kernel takes the ids alone.
        mask = mask.dense()  # Every token has its own segment's: none empty.
    elif mask is not None:
      # A query with no key to attend to (a batch's empty row, an empty
      # slot's probe) attends to every key: nothing reads its output, and a
      # row of masked logits alone gives NaN once XLA has rearranged the
      # softmax.
      mask = mask | ~mask.any(-1, keepdims=True)
    fused = {"fused": _fused_attention,
             "splash": splash.attention}.get(config.attention)
    if fused:
      out = fused(project("query"), project("key"), project("value"), mask)
      return _attention_out(out, width, config)

    # Heads before tokens, [..., heads, tokens, head_dim], for both
    # batched matmuls: left to itself, XLA:CPU lays weights.v out with the
    # tokens last and runs it far below its matmul rate
    # (docs/speed_on_cpu.md). On TPU the layout is XLA's to choose either way.
    q, k, v = (jnp.swapaxes(project(name), -2, -3)
               for name in ("query", "key", "value"))
    # Softmax in float32 whatever the compute dtype: bf16 logits lose the
    # small differences that attention depends on.
    logits = jnp.einsum("...hqd,...hkd->...hqk", q, k).astype(jnp.float32)
    if mask is not None:
      # Masked keys' logits pushed to the lowest finite value, by a bias the
      # same for every head.
      logits = logits + _heads_axis(jnp.where(
          mask, 0.0, jnp.finfo(jnp.float32).min))
    weights = nn.softmax(logits / jnp.sqrt(head_dim).astype(jnp.float32))
    if self.record:  # The Section 4.5 figures: distance, rollout.
      self.sow("intermediates", "attention_weights", weights)
    weights = nn.Dropout(config.attention_dropout_rate)(
        weights, deterministic=not train)
    out = jnp.einsum("...hqk,...hkd->...hqd", weights.astype(config.dtype), v)
    return _attention_out(jnp.swapaxes(out, -2, -3), width, config)


def _attention_out(out, width, config):
  """[..., tokens, heads, head_dim] -> [..., tokens, width]."""
  return nn.DenseGeneral(
      width, axis=(-2, -1), dtype=config.dtype,
      param_dtype=config.param_dtype,
      kernel_init=layers.init(nn.initializers.xavier_uniform(),
                        ("heads", "kv", "embed")),
      bias_init=layers.init(nn.initializers.zeros, ("embed",)),
      dot_general=layers.dot_general(config),
      name="out")(out)


def _heads_axis(mask):
  """A [N, keys] or [N, queries, keys] mask (or bias) as [N, 1, queries or
  1, keys], the same for every head."""
  return mask[:, None, None, :] if mask.ndim == 2 else mask[:, None]


def _fused_attention(query, keys, values, mask=None):
  """jax.nn.dot_product_attention of [N, tokens, heads, head_dim] inputs:
  cuDNN's kernel where it runs (NVIDIA GPUs, half precision, no mask or
  the real keys first), else XLA's. `mask`: Attention's."""
  if jax.default_backend() != "gpu" or query.dtype not in (
      jnp.bfloat16, jnp.float16) or (mask is not None and mask.ndim == 3):
    return jax.nn.dot_product_attention(
        query, keys, values, implementation="xla",
        mask=None if mask is None else _heads_axis(mask))
  # cuDNN trains on even token counts only (a ViT has 197 tokens): pad the
  # queries and keys with one token each, masked out, and drop its output.
  tokens, key_tokens = query.shape[1], keys.shape[1]

  def even(x):
    return jnp.pad(x, [(0, 0), (0, x.shape[1] % 2), (0, 0), (0, 0)])

  batch = query.shape[0]
  key_lengths = (jnp.full((batch,), key_tokens, jnp.int32) if mask is None
                 else mask.sum(-1).astype(jnp.int32))
  out = jax.nn.dot_product_attention(
      even(query), even(keys), even(values),
      query_seq_lengths=jnp.full((batch,), tokens, jnp.int32),
      key_value_seq_lengths=key_lengths, implementation="cudnn")
  return out[:, :tokens]
