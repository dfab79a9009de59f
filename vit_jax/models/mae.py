"""Masked autoencoders (He et al., CVPR 2022): a ViT encoder that sees a
random share of each image's patches, and a light decoder of its own
width, depth and heads that predicts the pixels of the others.

  1. Each image's patches are ranked by a noise [N, L] (uniform draws: the
     objective's, training/objectives/mae.py, one row an image); the
     `round(L * (1 - mask_ratio))` patches of the smallest noise are kept
     (transformers' `ViTMAEForPreTraining` keeps the same ones for the
     same noise: it keeps `int(L * (1 - mask_ratio))`, which differs only
     where L * (1 - mask_ratio) is not whole; `keep_count` says ours).
  2. The encoder (models/encoder.py's ImageEncoder, with the class token)
     embeds every patch, keeps those, and runs its blocks on them alone,
     each at its place in the grid (its position table, or RoPE, read
     there), so it costs a quarter of the tokens at ratio 0.75.
  3. The decoder maps the encoded tokens to its width (`embed`), puts a
     learned [mask] vector (`mask_token`) in every removed patch's place,
     adds its own position embedding over the whole grid (fixed 2-D
     sines and cosines; the class token's row is zero), runs its blocks and
     final LayerNorm (`Transformer`, an Encoder of models/encoder.py), and
     predicts each patch's pixels (`pred`), p * p * 3 values in (row,
     column, channel) order, the class token's prediction dropped.

A NaFlex batch (naflex.Patches: each image at its own grid, padded to L
patches) is masked image by image: an image of n real patches keeps
floor(n * (1 - mask_ratio)) of them (at least one), ranked by its noise
over its real patches; the encoder runs on K = keep_count(L) slots, those
beyond an image's own count left out of the attention; the decoder sees
each image's grid, and the loss reads its removed real patches only.
Packed sequences are not taken.

The params: the encoder's in the release layout (embedding, cls,
Transformer), so `init_from` fine-tunes it as any ViT (weights/adaptation
drops `decoder`); the decoder's under `decoder`.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import layers, naflex, options, tokens as tokens_lib
from vit_jax.models.config import ViTConfig
from vit_jax.models.encoder import Encoder, ImageEncoder, unit_range

# config.mae's name of each DecoderSizes field: decoder_hidden_size, ...
SETTINGS_PREFIX = "decoder_"
DecoderSizes = options.transformer_sizes(
    "DecoderSizes", "the decoder's", (512, 8, 16, 2048), SETTINGS_PREFIX,
    "The decoder's own sizes (the paper's default: 512 wide, 8 blocks, 16 "
    "heads, MLP 2048): config.mae's `decoder_*` keys are these fields "
    "(runs/objective_settings.py derives them).", __name__)


def keep_count(num_patches, mask_ratio):
  """The patches each image keeps: L * (1 - ratio), rounded down as
  transformers and facebookresearch/mae do, at least one."""
  return max(int(num_patches * (1 - mask_ratio)), 1)


def kept(noise, count):
  """[N, count] int32: the places of each row's `count` smallest noises,
  in ascending order of noise (transformers' order: argsort of the
  noise, first `count`)."""
  return jnp.argsort(noise, axis=1)[:, :count].astype(jnp.int32)


def removed_mask(keep, num_patches):
  """[N, L] float32: 1 where a patch was removed (what the loss reads), 0
  where kept."""
  n = keep.shape[0]
  mask = jnp.ones((n, num_patches), jnp.float32)
  return mask.at[jnp.arange(n)[:, None], keep].set(0.0)


def patchify(images, patch_size):
  """[N, L, p * p * C] of NHWC images: each patch's pixels in (row,
  column, channel) order, the patches row-major (transformers' and
  facebookresearch/mae's `patchify` of NCHW images gives the same)."""
  n, height, width, channels = images.shape
  p = patch_size
  x = images.reshape(n, height // p, p, width // p, p, channels)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(
      n, (height // p) * (width // p), p * p * channels)


def decoder_config(encoder_config, sizes):
  """The decoder's ViTConfig: the encoder's function (dtype, LayerNorm
  epsilon, GELU, attention) at the decoder's sizes, with fixed sin-cos
  positions and none of the encoder's extra tokens or RoPE."""
  return dataclasses.replace(
      encoder_config, hidden_size=sizes.hidden_size,
      num_layers=sizes.num_layers, num_heads=sizes.num_heads,
      mlp_dim=sizes.mlp_dim, posemb="sincos2d", rope="", num_registers=0,
      distill_token=False, layer_scale=None, final_norm="tokens",
      resnet_stages=None, dropout_rate=0.0, attention_dropout_rate=0.0,
      drop_path_rate=0.0)


class MaskedAutoencoder(nn.Module):
  """A masked autoencoder. Called with images [N, H, W, 3] (in [-1, 1], or
  uint8) and a noise [N, L]: (predicted pixels [N, L, p * p * 3] float32,
  the removed mask [N, L], 1 where removed). Without a noise every patch is
  kept (what `init` and the features read).

  `decoder`: the decoder's ViTConfig (`decoder_config`), whose posemb may
  also be "learn" (a table read from a checkpoint)."""
  config: ViTConfig
  decoder: ViTConfig
  mask_ratio: float = 0.75

  @property
  def token_stride(self):
    return self.config.patch_size

  def describe_patch(self):
    return f"patch size {self.config.patch_size}"

  @nn.nowrap
  def check_options(self):
    config = self.config
    if config.resnet_stages is not None:
      raise errors.InputError("a masked autoencoder embeds pixels' patches: "
                              "it takes no hybrid ResNet stem")
    if not config.class_token:
      raise errors.InputError(
          "a masked autoencoder's encoder keeps a class token (as MAE's "
          "does): classifier must be 'token'")
    if not 0 < self.mask_ratio < 1:
      raise errors.InputError(
          f"mask_ratio must be in (0, 1), got {self.mask_ratio!r}")

  def setup(self):
    self.encoder = ImageEncoder(config=self.config, mask_token=False)
    nn.share_scope(self, self.encoder)
    self.decode = Decoder(config=self.decoder, patch_size=self.config.patch_size,
                          name="decoder")

  def __call__(self, images, *, train, noise=None):
    if isinstance(images, naflex.Packed):
      raise errors.InputError("a masked autoencoder takes square images "
                              "or NaFlex patches, not packed sequences")
    if isinstance(images, naflex.Patches):
      return self._naflex(images, train, noise)
    p = self.config.patch_size
    grid = (images.shape[1] // p, images.shape[2] // p)
    num_patches = grid[0] * grid[1]
    if noise is None:  # Every patch, on the grid (the tables made there).
      keep = jnp.broadcast_to(jnp.arange(num_patches, dtype=jnp.int32),
                              (images.shape[0], num_patches))
      encoded = self.encoder(images, train=train)
    else:
      keep = kept(noise, keep_count(num_patches, self.mask_ratio))
      encoded = self.encoder(images, train=train, keep=keep)
    return (self.decode(encoded.values, keep, grid, train=train),
            removed_mask(keep, num_patches))

  def _naflex(self, patches, train, noise):
    """(predicted pixels [N, L, p * p * 3], removed [N, L]) of a NaFlex
    batch: the module docstring."""
    n, length = patches.pixels.shape[:2]
    real = naflex.patch_mask(patches.grid, length)
    if noise is None:
      keep = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                              (n, length))
      valid = real
      encoded = self.encoder(patches, train=train)
    else:
      # Padding ranks after every real patch: no image keeps one.
      keep = kept(jnp.where(real, noise, jnp.inf),
                  keep_count(length, self.mask_ratio))
      counts = jnp.maximum(jnp.floor(
          real.sum(axis=1) * (1 - self.mask_ratio)), 1).astype(jnp.int32)
      valid = jnp.arange(keep.shape[1])[None] < counts[:, None]
      encoded = self.encoder(patches, train=train, keep=keep,
                             keep_valid=valid)
    kept_mask = jnp.zeros((n, length), jnp.float32).at[
        jnp.arange(n)[:, None], keep].set(valid.astype(jnp.float32))
    return (self.decode(encoded.values, keep, patches, train=train,
                        valid=valid),
            real.astype(jnp.float32) * (1 - kept_mask))

  def encode(self, images, *, train=False):
    """The encoder's Tokens of every patch (what features read)."""
    return self.encoder(images, train=train)


class Decoder(nn.Module):
  """Encoded tokens of the kept patches [N, prefix + K, D] -> predicted
  pixels [N, L, p * p * 3] float32 of every patch (the module docstring),
  on `layout`: a (rows, cols) grid every image shares, or a NaFlex batch
  (naflex.Patches) whose images have their own; `valid` [N, K]: which
  kept tokens count (None: all)."""
  config: ViTConfig
  patch_size: int

  @nn.compact
  def __call__(self, encoded, keep, layout, *, train, valid=None):
    config = self.config
    width = config.hidden_size
    dense = lambda features, name: nn.Dense(  # noqa: E731
        features, dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=layers.init(nn.initializers.xavier_uniform(),
                                ("embed", "mlp")),
        bias_init=layers.init(nn.initializers.zeros, ("mlp",)), name=name)
    x = dense(width, "embed")(encoded)
    flexible = isinstance(layout, naflex.Patches)
    n = keep.shape[0]
    num_patches = (layout.pixels.shape[1] if flexible
                   else layout[0] * layout[1])
    prefix = x.shape[1] - keep.shape[1]
    mask_token = self.param(
        "mask_token", layers.init(nn.initializers.normal(stddev=0.02),
                                  (None, None, "embed")),
        (1, 1, width), config.param_dtype)
    patches = jnp.broadcast_to(mask_token.astype(x.dtype),
                               (n, num_patches, width))
    values = x[:, prefix:]
    if valid is not None:  # What an image did not keep is masked too.
      values = jnp.where(valid[..., None], values,
                         mask_token.astype(x.dtype))
    patches = patches.at[jnp.arange(n)[:, None], keep].set(values)
    if flexible:
      tokens = tokens_lib.of_patches(patches, layout, prefix, 0)
    else:
      tokens = tokens_lib.of_grid(patches, layout)
    x = jnp.concatenate([x[:, :prefix], patches], axis=1)
    tokens = tokens.replace(values=x)
    x = Encoder(config=config, name="Transformer")(tokens, train=train)
    pixels = self.patch_size ** 2 * 3
    return dense(pixels, "pred")(x[:, prefix:]).astype(jnp.float32)


def pixel_targets(images, patch_size, norm_pix_loss):
  """[N, L, p * p * 3] float32: what each patch's prediction is compared
  with (images, or a NaFlex batch's patches): its pixels in [-1, 1], or
  with `norm_pix_loss` normalised per
  patch, (x - mean) / sqrt(var + 1e-6) with the unbiased variance (torch's
  `var`, as MAE's code computes it)."""
  if isinstance(images, naflex.Patches):  # Already patches, in that order.
    target = unit_range(images.pixels).astype(jnp.float32)
  else:
    target = patchify(unit_range(images).astype(jnp.float32), patch_size)
  if not norm_pix_loss:
    return target
  mean = target.mean(axis=-1, keepdims=True)
  var = target.var(axis=-1, ddof=1, keepdims=True)
  return (target - mean) / jnp.sqrt(var + 1e-6)


def reconstruction_losses(predicted, target, removed):
  """Each image's mean over its removed patches of the mean squared error
  over a patch's values [N]. Every image removes as many patches, so the
  mean of these is MAE's loss (the sum over removed patches over their
  count)."""
  per_patch = jnp.mean(jnp.square(predicted - target), axis=-1)
  return (per_patch * removed).sum(axis=1) / jnp.maximum(removed.sum(axis=1),
                                                         1.0)
