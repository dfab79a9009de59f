"""The small pieces every part of the ViT builds its layers from: logical
axis names on initialisers, the LayerNorm as the config sets it, and the
multiply of the encoder blocks' dense layers."""

import flax.linen as nn

from vit_jax.models import fp8 as fp8_lib


def init(initializer, axes):
  """`initializer` whose params carry the logical axis names `axes`
  (vit_jax.sharding maps them to mesh axes)."""
  return nn.with_logical_partitioning(initializer, axes)


def layer_norm(name, config):
  return nn.LayerNorm(
      epsilon=config.layer_norm_epsilon, dtype=config.dtype,
      param_dtype=config.param_dtype,
      scale_init=init(nn.initializers.ones, ("embed",)),
      bias_init=init(nn.initializers.zeros, ("embed",)),
      name=name)


def dot_general(config):
  """What the encoder blocks' dense layers multiply with: None (flax's
  default) or float8's."""
  return fp8_lib.dot_general if config.fp8 else None
