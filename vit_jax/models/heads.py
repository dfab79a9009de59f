"""What reads the encoded tokens: the classifier's head (the class token,
the patches' mean, or attention pooling, MAPHead, then the logits) and
masked patch prediction's per-patch colour head."""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import layers, masked_patches as mpp_lib
from vit_jax.models.attention import Attention
from vit_jax.models.blocks import MlpBlock
from vit_jax.models.config import ViTConfig


class ClassifierHead(nn.Module):
  """Encoded tokens (models/tokens.py) -> float32 logits [N, num_classes]:
  the class token ("token"), the mean of the patches ("gap") or a learned
  probe's attention over them ("map"), normalised when `final_norm` is
  "pooled" (timm's fc_norm), an optional tanh pre-logits layer of
  `representation_size`, and a zero-initialised linear head. Only the
  patches of the tokens' `pool_mask` are pooled (a NaFlex batch's real
  ones). With a distillation token, the class and distillation tokens
  each go through the same layers to a head of their own (`head`,
  `head_dist`): the logits are the heads' mean, or with `both_heads` the
  pair (class head's, distillation head's); the features are the mean of
  what the two heads read. Tokens of packed sequences are read image by
  image, [N, K, ...]: each slot's class token, its patches' mean, or its
  own probe over its patches. `pre_logits`: return what the head reads
  and make no head (a two-tower model's image tower, models/two_towers.py,
  whose embedding it is)."""
  num_classes: int
  config: ViTConfig

  @nn.compact
  def __call__(self, tokens, both_heads=False, pre_logits=False):
    config = self.config
    if config.classifier == "token":
      x = _class_tokens(tokens, config)
    elif config.classifier == "map":
      x = MAPHead(config=config, name="MAPHead_0")(
          tokens.patches, tokens.pool_mask, tokens.slots)
    else:
      x = _mean(tokens.patches, tokens.pool_mask)
    if config.final_norm == "pooled":
      x = layers.layer_norm("fc_norm", config)(x)
    if config.representation_size is not None:
      x = nn.Dense(
          config.representation_size, dtype=config.dtype,
          param_dtype=config.param_dtype,
          kernel_init=layers.init(nn.initializers.lecun_normal(),
                                  ("embed", "mlp")),
          bias_init=layers.init(nn.initializers.zeros, ("mlp",)),
          name="pre_logits")(x)
      x = nn.tanh(x)
    # What the head reads (the pre-logits): few-shot evaluation fits its own
    # linear classifiers to these.
    self.sow("intermediates", "features",
             x.mean(axis=-2) if config.distill_token else x)
    if pre_logits:
      return x
    # A zero kernel: a fresh head predicts the same for every image.
    head = lambda name, features: nn.Dense(
        self.num_classes, dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=layers.init(nn.initializers.zeros, (None, "classes")),
        bias_init=layers.init(nn.initializers.constant(config.head_bias_init),
                              ("classes",)),
        name=name)(features).astype(jnp.float32)
    if not config.distill_token:
      return head("head", x)
    pair = head("head", x[..., 0, :]), head("head_dist", x[..., 1, :])
    return pair if both_heads else (pair[0] + pair[1]) / 2


def _class_tokens(tokens, config):
  """Each image's class token [N, (K,) D], or with a distillation token the
  pair [N, (K,) 2, D]: the layers after it act on each token alone."""
  x = tokens.values
  count, prefix = tokens.images_per_row, config.embedded_prefix_tokens
  x = x[:, :prefix * count].reshape(x.shape[0], count, prefix, x.shape[-1])
  x = x[:, :, :2] if config.distill_token else x[:, :, 0]
  return x if tokens.slots else x[:, 0]


def _mean(patches, mask):
  """The mean of `patches` [N, L, D] each image holds: with `mask` None,
  all of each row; [N, L], a row's real ones; [N, K, L], each slot's, [N,
  K, D]."""
  if mask is None:
    return patches.mean(axis=1)
  if mask.ndim == 2:
    count = jnp.maximum(mask.sum(1, keepdims=True), 1)
    return jnp.where(mask[..., None], patches, 0).sum(1) / count.astype(
        patches.dtype)
  weights = jnp.swapaxes(mask, 1, 2).astype(patches.dtype)  # [N, L, K]
  return jnp.einsum("nlk,nld->nkd", weights, patches) / jnp.maximum(
      weights.sum(1), 1)[..., None]


class MAPHead(nn.Module):
  """Multi-head attention pooling: a learned probe attends to the tokens,
  then a residual MLP on what it gathered (big_vision's MAPHead, the
  layout of SigLIP's image tower). `mask`: Attention's; packed sequences
  have `slots` copies of the probe, each attending to its image's patches
  ([N, slots, patches]), and give [N, slots, D]."""
  config: ViTConfig

  @nn.compact
  def __call__(self, x, mask=None, slots=None):
    config = self.config
    probe = self.param("probe", layers.init(nn.initializers.xavier_uniform(),
                                            (None, None, "embed")),
                       (1, 1, x.shape[-1]), config.param_dtype)
    probe = jnp.tile(probe.astype(x.dtype), (x.shape[0], slots or 1, 1))
    # big_vision's and timm's pooling normalise no queries or keys.
    # One query token: the fused kernel has nothing to gain here.
    head = dataclasses.replace(config, fp8=False)
    y = Attention(config=dataclasses.replace(head, qk_norm=False,
                                             key_bias=True,
                                             attention="einsum"),
                  record=False, name="MultiHeadDotProductAttention_0")(
                      probe, train=False, kv=x, mask=mask)
    z = layers.layer_norm("LayerNorm_0", config)(y)
    y = y + MlpBlock(config=head, name="MlpBlock_0")(z, train=False)
    return y if slots else y[:, 0]


class PatchColourHead(nn.Module):
  """Encoded tokens (models/tokens.py) -> float32 logits [N, patches, 512]:
  each patch token's prediction of its patch's mean colour
  (vit_jax/models/masked_patches.py)."""
  config: ViTConfig

  @nn.compact
  def __call__(self, tokens):
    config = self.config
    return nn.Dense(
        mpp_lib.NUM_CLASSES, dtype=config.dtype,
        param_dtype=config.param_dtype,
        kernel_init=layers.init(nn.initializers.zeros, (None, "classes")),
        bias_init=layers.init(nn.initializers.zeros, ("classes",)),
        name="mpp_head")(tokens.patches).astype(jnp.float32)


def logits_and_pre_logits(model, params, images):
  """(logits, pre-logits) of a VisionTransformer on `images`, evaluated:
  what its head gives, and what its head reads (ClassifierHead sows it)."""
  logits, state = model.apply({"params": params}, images, train=False,
                              mutable=["intermediates"])
  (pre_logits,) = state["intermediates"]["features"]
  return logits, pre_logits
