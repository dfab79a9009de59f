"""The BiT ResNet stem of the hybrid models (R50+ViT-B/16, ...).

A bottleneck ResNet with Big Transfer's changes (Kolesnikov et al. 2020):
every convolution has its kernel weight-standardised, and GroupNorm (32
groups) replaces BatchNorm, so nothing depends on the batch. Module names
follow the released hybrid checkpoints: `conv_root`, `gn_root`, then
`block{i}/unit{j}/{conv1,gn1,conv2,gn2,conv3,gn3,conv_proj,gn_proj}`.
Kernels are [k, k, in, out]; their channel axes are "in_channels" and
"channels" in `vit_jax.sharding`'s table.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import sharding

Dtype = Any

GROUPS = 32
GROUPNORM_EPSILON = 1e-6
STANDARDISE_EPSILON = 1e-5


def _init(initializer, axes):
  return nn.with_logical_partitioning(initializer, axes)


class StdConv(nn.Module):
  """A bias-free convolution with "SAME" padding whose kernel is
  standardised per output channel (zero mean, unit standard deviation over
  its window and input channels) each time it is used; the raw kernel is
  the parameter."""
  features: int
  kernel_size: int
  strides: int = 1
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    k = self.kernel_size
    kernel = self.param(
        "kernel", _init(nn.initializers.lecun_normal(),
                        (None, None, "in_channels", "channels")),
        (k, k, x.shape[-1], self.features), self.param_dtype)
    # Standardised in float32 whatever the compute dtype.
    kernel = kernel.astype(jnp.float32)
    kernel = kernel - kernel.mean(axis=(0, 1, 2))
    kernel = kernel / (kernel.std(axis=(0, 1, 2)) + STANDARDISE_EPSILON)
    return jax.lax.conv_general_dilated(
        x, kernel.astype(self.dtype), (self.strides, self.strides), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def group_norm(name, dtype, param_dtype, scale_init=nn.initializers.ones):
  return nn.GroupNorm(
      num_groups=GROUPS, epsilon=GROUPNORM_EPSILON, dtype=dtype,
      param_dtype=param_dtype, scale_init=_init(scale_init, ("channels",)),
      bias_init=_init(nn.initializers.zeros, ("channels",)), name=name)


class BottleneckUnit(nn.Module):
  """1x1 conv (`features`) -> 3x3 conv with the stride -> 1x1 conv
  (4 x `features`), each followed by GroupNorm, ReLU between; added to the
  input, which a strided 1x1 conv projects where the shape changes. The
  last GroupNorm's scale starts at zero, so a fresh unit is the identity
  (ReLU aside)."""
  features: int
  strides: int = 1
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    kinds = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    residual = x
    if x.shape[-1] != 4 * self.features or self.strides != 1:
      residual = StdConv(4 * self.features, 1, self.strides, **kinds,
                         name="conv_proj")(x)
      residual = group_norm("gn_proj", **kinds)(residual)
    y = StdConv(self.features, 1, **kinds, name="conv1")(x)
    y = nn.relu(group_norm("gn1", **kinds)(y))
    y = StdConv(self.features, 3, self.strides, **kinds, name="conv2")(y)
    y = nn.relu(group_norm("gn2", **kinds)(y))
    y = StdConv(4 * self.features, 1, **kinds, name="conv3")(y)
    y = group_norm("gn3", **kinds, scale_init=nn.initializers.zeros)(y)
    return nn.relu(residual + y)


class Stage(nn.Module):
  """`units` bottleneck units; the first one applies the stride."""
  units: int
  features: int
  strides: int
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    for j in range(self.units):
      x = BottleneckUnit(self.features, self.strides if j == 0 else 1,
                         dtype=self.dtype, param_dtype=self.param_dtype,
                         name=f"unit{j + 1}")(x)
    return x


def reduction(stages):
  """How many times smaller than the image the stem's feature map is."""
  return 4 * 2 ** (len(stages) - 1)


def conv_flops(stages, width, image_size):
  """(FLOPs of the stem's convolutions for one image, the side and the
  channels of its feature map); a multiply-add counts two."""
  side = -(-image_size // 2)  # "SAME" with stride 2: the ceiling.
  macs = side * side * 7 * 7 * 3 * width
  side = -(-side // 2)  # The max-pool.
  channels = width
  for i, units in enumerate(stages):
    features = width * 2**i
    for j in range(units):
      out = -(-side // 2) if i and not j else side
      macs += (side * side * channels * features        # conv1
               + out * out * 9 * features * features    # conv2
               + out * out * features * 4 * features)   # conv3
      if j == 0:  # The projection: channels or resolution change.
        macs += out * out * channels * 4 * features
      side, channels = out, 4 * features
  return 2 * macs, side, channels


def stem(x, stages, width, dtype, param_dtype):
  """Applies the BiT stem inside the calling compact module (the modules
  are named at the caller's level, as in the released checkpoints).

  Root: 7x7 conv with stride 2, GroupNorm, ReLU, 3x3 max-pool with stride
  2. Then one stage per entry of `stages`, that many units each; stage i
  (from 0) has 4 x width x 2^i output channels and halves the resolution,
  but for the first. The feature map is 4 x 2^(len(stages) - 1) times
  smaller than the image: 16 for three stages, 32 for four.
  """
  kinds = dict(dtype=dtype, param_dtype=param_dtype)
  x = sharding.constrain(x, ("batch", None, None, None))
  x = StdConv(width, 7, 2, **kinds, name="conv_root")(x)
  x = nn.relu(group_norm("gn_root", **kinds)(x))
  x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
  for i, units in enumerate(stages):
    x = Stage(units, width * 2**i, 2 if i else 1, **kinds,
              name=f"block{i + 1}")(x)
  return x
