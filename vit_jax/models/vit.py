"""The Vision Transformer (Dosovitskiy et al., ICLR 2021) as Flax linen modules:
the classifier and masked patch prediction's model, each an ImageEncoder
(models/encoder.py) read by a head (models/heads.py).

Module names follow the released checkpoints (`Transformer/encoderblock_{i}/
MultiHeadDotProductAttention_1`, ...), so our params tree *is* the release
layout and `weights.npz.save_npz` is a flatten. Every parameter, and each
block's input, carries logical axis names; `vit_jax.sharding`'s rules table
maps them to mesh axes, so the model names none.
"""

import flax.linen as nn

from vit_jax import errors
from vit_jax.models import config as config_lib, naflex, resnet
from vit_jax.models.config import ViTConfig
from vit_jax.models.encoder import ImageEncoder
from vit_jax.models.heads import ClassifierHead, PatchColourHead


class VisionTransformer(nn.Module):
  """ViT classifier: an ImageEncoder read by a ClassifierHead. Images are
  NHWC in [-1, 1], or uint8 in [0, 255]; returns float32 logits. Its
  settings are its `config`'s (`model.config.num_heads`).

  The encoder and the head share this module's scope (`nn.share_scope`),
  so the params are the release layout: embedding, cls, Transformer,
  pre_logits, head.
  """
  num_classes: int
  config: ViTConfig

  @property
  def token_stride(self):
    """Image pixels per token along a side: the patch size, times what a
    hybrid's stem shrinks the image by (4 x 2^(stages - 1))."""
    config = self.config
    if config.resnet_stages is None:
      return config.patch_size
    return config.patch_size * resnet.reduction(config.resnet_stages)

  def describe_patch(self):
    """'patch size 16', and for a hybrid what the stem multiplies it by."""
    patch_size = self.config.patch_size
    if self.config.resnet_stages is None:
      return f"patch size {patch_size}"
    stem = self.token_stride // patch_size
    return f"patch size {patch_size} x {stem} (the ResNet stem's)"

  def setup(self):
    self.check_options()
    self.encoder = ImageEncoder(config=self.config, mask_token=False)
    nn.share_scope(self, self.encoder)
    self.classify = ClassifierHead(num_classes=self.num_classes,
                                   config=self.config)
    nn.share_scope(self, self.classify)

  def __call__(self, images, *, train, both_heads=False, pre_logits=False):
    """images: NHWC, or a NaFlex batch (naflex.Patches), or a packed one
    (naflex.Packed: logits [N, K, classes], a row per slot). `both_heads`:
    a model with a distillation token returns the pair (class head's,
    distillation head's logits) rather than their mean. `pre_logits`:
    what the head reads, and no head is made (a two-tower model's image
    tower)."""
    self.check_image_size(images)
    return self.classify(self.encoder(images, train=train), both_heads,
                         pre_logits)

  @nn.nowrap
  def check_options(self):
    """InputError for options no model has; models.create calls it too."""
    config_lib.check(self.config)

  @nn.nowrap
  def check_image_size(self, images):
    if isinstance(images, (naflex.Patches, naflex.Packed)):
      return self.check_patches(images)
    height, width = images.shape[1:3]
    if height % self.token_stride or width % self.token_stride:
      raise errors.InputError(
          f"{self.describe_patch()} does not divide the image "
          f"size {height}x{width}")

  @nn.nowrap
  def check_patches(self, patches):
    config = self.config
    if config.resnet_stages is not None:
      raise errors.InputError(
          "a hybrid's ResNet stem reads whole images: it takes no NaFlex "
          "patches")
    size = config.patch_size ** 2 * 3
    if patches.pixels.ndim != 3 or patches.pixels.shape[-1] != size:
      raise errors.InputError(
          f"NaFlex patches of shape {patches.pixels.shape}: "
          f"{self.describe_patch()} takes [batch, patches, {size}]")


class MaskedPatchViT(VisionTransformer):
  """The same encoder, with a [mask] embedding, read by a PatchColourHead:
  masked patch prediction (`vit_jax/models/masked_patches.py`). Returns
  logits [N, patches, 512]; `corruption` (a masked_patches.Corruption) is
  applied to the patch embeddings. num_classes and representation_size are
  unused. Its encoder fine-tunes like any other through `init_from`, which
  drops mask_embedding and mpp_head."""

  @nn.nowrap
  def check_options(self):
    super().check_options()
    if self.config.final_norm == "pooled":
      raise errors.InputError(
          "masked patch prediction reads every token: final_norm must be "
          "'tokens'")

  def setup(self):
    self.check_options()
    self.encoder = ImageEncoder(config=self.config, mask_token=True)
    nn.share_scope(self, self.encoder)
    self.predict = PatchColourHead(config=self.config)
    nn.share_scope(self, self.predict)

  def __call__(self, images, *, train, corruption=None):
    if isinstance(images, (naflex.Patches, naflex.Packed)):
      raise errors.InputError("masked patch prediction takes square images, "
                              "not NaFlex patches or packed sequences")
    self.check_image_size(images)
    return self.predict(self.encoder(images, train=train,
                                     corruption=corruption))
