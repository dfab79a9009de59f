"""From images to encoded tokens: the patch embedding (under a hybrid's
ResNet stem), the prefix tokens, and the Transformer encoder (position
embedding, registers, the blocks, the final LayerNorm)."""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax import errors
from vit_jax.models import (
  layers,
  masked_patches as mpp_lib,
  naflex,
  resnet,
  rope as rope_lib,
  tokens as tokens_lib,
)
from vit_jax.models.blocks import EncoderBlock
from vit_jax.models.config import REMAT_POLICIES, ViTConfig
from vit_jax.models.positions import AddPositionEmbedding


def unit_range(images):
  """uint8 images, as the input pipeline ships them, scaled to [-1, 1] in
  float32 (the released checkpoints' range); float images are taken to be
  in that range already."""
  if images.dtype == jnp.uint8:
    return images.astype(jnp.float32) / 127.5 - 1
  return images


class ImageEncoder(nn.Module):
  """Images to encoded tokens (models/tokens.py), what every head reads.

  uint8 images are scaled to [-1, 1] here, on the device; an optional BiT
  ResNet stem; the patch embedding; for masked patch prediction, a learned
  [mask] embedding that a `corruption` puts in when `mask_token`; the
  class token first for classifier "token", and the distillation token
  after it; then the Encoder.

  `keep` [N, K] int: only these patches of each image go on (masked
  autoencoders' encoder, models/mae.py), each at its place in the grid;
  `keep_valid` [N, K] bool, for a NaFlex batch: which of them count.

  A NaFlex batch (naflex.Patches) in place of images: each patch is
  embedded by the same convolution, and each image keeps its own grid. A
  packed one (naflex.Packed): the same, with each slot's prefix tokens,
  slot after slot, before the patches. Here, and only here, the form of
  the input is read: the layers after read the Tokens built of it.
  """
  config: ViTConfig
  mask_token: bool

  @nn.compact
  def __call__(self, images, *, train, corruption=None, keep=None,
               keep_valid=None):
    config = self.config
    extra = (config.embedded_prefix_tokens, config.num_registers)
    if isinstance(images, naflex.Packed):
      tokens = tokens_lib.of_packed(self._embed_patches(images.pixels),
                                    images, *extra)
    elif isinstance(images, naflex.Patches):
      tokens = tokens_lib.of_patches(self._embed_patches(images.pixels),
                                     images, *extra)
    else:
      tokens = self._embed_images(images)
    if keep is not None:
      tokens = tokens_lib.visible(tokens, keep, keep_valid)
    x = tokens.values
    n, _, d = x.shape
    if self.mask_token:
      mask = self.param(
          "mask_embedding", layers.init(nn.initializers.normal(stddev=0.02),
                                        (None, None, "embed")),
          (1, 1, d), config.param_dtype)
      if corruption is not None:
        x = mpp_lib.apply(corruption, x, mask)
    prefix = []
    if config.class_token:
      prefix.append(self.param(
          "cls", layers.init(nn.initializers.zeros, (None, None, "embed")),
          (1, 1, d), config.param_dtype))
    if config.distill_token:
      # Drawn, not zero as the class token is: the two then differ from the
      # first step, as in DeiT.
      prefix.append(self.param(
          "dist", layers.init(nn.initializers.normal(stddev=0.02),
                              (None, None, "embed")),
          (1, 1, d), config.param_dtype))
    if prefix:
      prefix = jnp.concatenate([token.astype(x.dtype) for token in prefix],
                               axis=1)
      x = jnp.concatenate(
          [jnp.tile(prefix, (n, tokens.images_per_row, 1)), x], axis=1)
    tokens = tokens.replace(values=x)
    encoded = Encoder(config=config, name="Transformer")(tokens, train=train)
    return tokens.replace(values=encoded)

  def _embed_images(self, images):
    """Tokens of NHWC images: a convolution of stride p, the patch size (on
    a hybrid's ResNet feature map)."""
    config = self.config
    x = unit_range(images).astype(config.dtype)
    if config.resnet_stages is not None:
      x = resnet.stem(x, stages=config.resnet_stages,
                      width=config.resnet_width, dtype=config.dtype,
                      param_dtype=config.param_dtype)
    p = config.patch_size
    x = nn.Conv(
        config.hidden_size, (p, p), strides=(p, p), padding="VALID",
        dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=layers.init(nn.initializers.lecun_normal(),
                                (None, None, None, "embed")),
        bias_init=layers.init(nn.initializers.zeros, ("embed",)),
        name="embedding")(x)
    n, h, w, _ = x.shape
    return tokens_lib.of_grid(x.reshape(n, h * w, -1), (h, w))

  def _embed_patches(self, pixels):
    """The embedding convolution's function on flattened patches [N, L,
    p * p * 3], as one matmul with its kernel [p, p, 3, D] flattened in
    the same order, which XLA:CPU runs faster than a convolution over
    N * L patches (docs/naflex.md). The params are made by square images,
    as every position table is."""
    params = self.variables.get("params", {}).get("embedding")
    if params is None:
      raise errors.InputError(
          "a NaFlex batch needs the patch embedding's params: initialise the "
          "model with square images (the run's image_size), then apply it "
          "to patches")
    kernel, bias = (nn.meta.unbox(params[name]) for name in ("kernel", "bias"))
    dtype = self.config.dtype
    patches = unit_range(pixels).astype(dtype)
    return (patches @ kernel.reshape(-1, kernel.shape[-1]).astype(dtype)
            + bias.astype(dtype))


class Encoder(nn.Module):
  """Position embedding, then `num_layers` blocks (scanned and
  rematerialised as the config says) and a final LayerNorm (unless
  `final_norm` is "pooled": then the head normalises what it reads).
  Reads Tokens (models/tokens.py); returns their values encoded, [N,
  tokens, D], each slot's registers after its prefix tokens."""
  config: ViTConfig

  @nn.compact
  def __call__(self, tokens, *, train):
    config = self.config
    x = AddPositionEmbedding(kind=config.posemb,
                             param_dtype=config.param_dtype,
                             name="posembed_input")(tokens)
    rope = self._rope_angles(tokens, train)
    if config.num_registers:
      registers = self.param(
          "registers", layers.init(nn.initializers.normal(stddev=0.02),
                                   (None, None, "embed")),
          (1, config.num_registers, x.shape[-1]), config.param_dtype)
      count = tokens.images_per_row
      registers = jnp.tile(registers.astype(x.dtype), (x.shape[0], count, 1))
      first = config.embedded_prefix_tokens * count
      x = jnp.concatenate([x[:, :first], registers, x[:, first:]], axis=1)
    x = nn.Dropout(config.dropout_rate)(x, deterministic=not train)
    block = EncoderBlock
    if config.remat_policy:
      # Argument 2 (after the module and x) is `train`, a Python bool.
      # Inside a scan, XLA cannot merge the recomputation away, so the CSE
      # barriers that nn.remat adds by default would only cost.
      block = nn.remat(block, policy=REMAT_POLICIES[config.remat_policy],
                       prevent_cse=not config.scan_layers, static_argnums=(2,))
    mask = tokens.attention_mask
    # Stochastic depth's rates, rising linearly to drop_path_rate at the
    # last block; a training step's argument only where it drops anything.
    rates = np.linspace(0.0, config.drop_path_rate, config.num_layers)
    dropping = bool(train and config.drop_path_rate)
    if config.scan_layers:
      block = nn.scan(
          block, variable_axes={"params": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast,) * 3 + ((0,) if dropping else ()),
          length=config.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = block(config=config, name="encoderblock")(
          x, train, mask, rope,
          *((jnp.asarray(rates, jnp.float32),) if dropping else ()))
    else:
      for i in range(config.num_layers):
        x, _ = block(config=config, name=f"encoderblock_{i}")(
            x, train, mask, rope, *((float(rates[i]),) if dropping else ()))
    if config.final_norm == "pooled":
      return x
    return layers.layer_norm("encoder_norm", config)(x)

  def _rope_angles(self, tokens, train):
    """[N or 1, patches, head_dim / 2] RoPE angles of the patches, each at
    its place in its image's grid (augmented in training where the config
    says, one draw an image), or None without RoPE; for rope "mixed",
    whose angles each block makes, the coordinates [N or 1, patches, 2]."""
    config = self.config
    if not config.rope:
      return None
    coords = rope_lib.coordinates(tokens.rows, tokens.cols, tokens.grid_rows,
                                  tokens.grid_cols, config.rope)
    if train and config.rope_augmentation.any:
      n = tokens.values.shape[0]
      coords = rope_lib.augment(
          jnp.broadcast_to(coords, (n,) + coords.shape[1:]),
          config.rope_augmentation, self.make_rng("dropout"),
          tokens.patch_images, tokens.images_per_row)
    if config.rope == "mixed":
      return coords
    return rope_lib.angles(coords, config.hidden_size // config.num_heads,
                           config.rope_theta, config.rope)
