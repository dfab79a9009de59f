"""What an image costs: analytic FLOPs (training/throughput.py turns them
into FLOP/s and MFU).

FLOPs count multiply-adds as two: a hybrid's ResNet convolutions, the matmuls
of the patch embedding, the attention projections and the MLPs, the
attention itself (queries x keys and weights x values), the pre-logits layer
and the head (each twice with a distillation token), and 2-D RoPE's turning
of the patches' queries and keys (two multiplies and an add per number).
Layer norms, GroupNorms, softmax, GELU and biases are left out: they are
small next to the matmuls, and the count stays within 5% of XLA's own
(tests/test_compute.py and tests/test_hybrid.py; docs/runs.md). A
training step is three forward passes per image: the forward, and a
backward of twice its cost.
"""

from vit_jax import models
from vit_jax.models import mae, masked_patches, resnet, splash

TRAIN_FORWARDS = 3  # Forward + backward (two forwards' worth).


def model_sizes(model, num_classes=1000):
  """A model name ("B/16"), typed model settings (runs/settings.py's
  Model) or a VisionTransformer -> the VisionTransformer it describes."""
  if isinstance(model, str):
    return models.create(model, num_classes)
  if isinstance(model, (models.VisionTransformer, mae.MaskedAutoencoder)):
    return model
  return models.create_from_settings(model, num_classes)


def flops_per_image(model, image_size, train=False, num_classes=1000,
                    num_patches=None, slots=1):
  """FLOPs of one image through the model (x3 for a training step);
  `num_patches`: a NaFlex image's, its budget's (padding costs as much),
  in place of image_size's. With `slots` > 1, of a packed sequence of
  num_patches patches (data/packing.py): each slot's prefix tokens and
  head."""
  vit = model_sizes(model, num_classes)
  if isinstance(vit, mae.MaskedAutoencoder):
    return masked_autoencoder_flops(vit, image_size, num_patches) * (
        TRAIN_FORWARDS if train else 1)
  config = vit.config
  d, mlp, p = config.hidden_size, config.mlp_dim, config.patch_size
  stem, channels, patches = _stem_and_patches(config, image_size, num_patches)
  tokens = patches + slots * config.num_prefix_tokens
  embedding = stem + 2 * patches * (p * p * channels) * d
  per_layer = block_flops(config, tokens, patches)
  head_in = d
  pre_logits = 0
  if config.representation_size is not None:
    pre_logits = 2 * d * config.representation_size
    head_in = config.representation_size
  head = 2 * head_in * vit.num_classes
  if config.distill_token:  # Both tokens through the layers and a head.
    pre_logits, head = 2 * pre_logits, 2 * head
  if config.classifier == "map":  # One query's attention, then an MLP.
    head += (2 * 2 * d * d              # the probe's query, the output
             + 2 * tokens * 2 * d * d   # every token's key and value
             + 2 * 2 * tokens * d       # q.k and weights.v
             + 2 * 2 * d * mlp)         # the MLP
  if isinstance(vit, models.MaskedPatchViT):  # 512 classes per patch.
    pre_logits, head = 0, 2 * d * masked_patches.NUM_CLASSES * patches
  forward = (embedding + config.num_layers * per_layer
             + slots * (pre_logits + head))
  return forward * (TRAIN_FORWARDS if train else 1)


def block_flops(config, tokens, patches):
  """One encoder block's FLOPs over `tokens` tokens, `patches` of them
  patches (what RoPE turns)."""
  d, mlp = config.hidden_size, config.mlp_dim
  mlp_matmuls = 3 if config.mlp == "swiglu" else 2  # SwiGLU's gate too
  flops = (2 * tokens * 4 * d * d         # q, k, v and out projections
           + 2 * tokens * mlp_matmuls * d * mlp  # the MLP's matmuls
           + 2 * 2 * tokens * tokens * d)  # q.k and weights.v
  if config.rope:
    flops += 2 * 3 * patches * d  # q's and k's patches turned.
  if config.rope == "mixed":  # Each block's angles: col * f_x + row * f_y.
    flops += 3 * patches * d // 2
  return flops


def masked_autoencoder_flops(model, image_size, num_patches=None):
  """The forward FLOPs of one image through a masked autoencoder
  (models/mae.py): the patch embedding of every patch, the encoder's
  blocks on the class token and the kept patches only, the decoder's
  embedding of those, its blocks on every patch and the class token, and
  its pixel predictions. `num_patches`: a NaFlex budget's, in place of
  image_size's (padding costs as much)."""
  config, decoder = model.config, model.decoder
  p, d, dd = config.patch_size, config.hidden_size, decoder.hidden_size
  patches = num_patches or (image_size // p) ** 2
  kept = mae.keep_count(patches, model.mask_ratio)
  prefix = config.num_prefix_tokens
  return (2 * patches * p * p * 3 * d
          + config.num_layers * block_flops(config, kept + prefix, kept)
          + 2 * (kept + prefix) * d * dd
          + decoder.num_layers * block_flops(decoder, patches + prefix,
                                             patches)
          + 2 * patches * dd * p * p * 3)


def splash_train_flops_per_image(model, image_size, num_patches=None):
  """FLOPs of one image's training step inside the splash attention kernels
  (models/splash.py), which the compiler's cost model does not count: q.k
  and weights.v of every block at the tokens the kernel pads to, forward
  and backward. A floor: the kernel's backward computes q.k again."""
  config = model_sizes(model).config
  _, _, patches = _stem_and_patches(config, image_size, num_patches)
  tokens = splash.padded_tokens(patches + config.num_prefix_tokens)
  forward = config.num_layers * 2 * 2 * tokens * tokens * config.hidden_size
  return TRAIN_FORWARDS * forward


def _stem_and_patches(config, image_size, num_patches=None):
  """(a hybrid's ResNet FLOPs or 0, the channels the patch embedding reads,
  the patches of an image)."""
  stem, side, channels = 0, image_size, 3
  if config.resnet_stages is not None:
    stem, side, channels = resnet.conv_flops(config.resnet_stages,
                                             config.resnet_width, image_size)
  if num_patches is None:
    num_patches = (side // config.patch_size) ** 2
  return stem, channels, num_patches


def two_towers_flops(model, image_size, text_length, pairs, num_patches=None):
  """The forward FLOPs of one image-text pair through a TwoTowers model
  (models/two_towers.py): the image tower to its pooled embedding, the
  text tower on `text_length` tokens and its head, and the pair's image's
  logits against the `pairs` texts it is scored with."""
  image = models.VisionTransformer(num_classes=0, config=model.config)
  text, width = model.text, model.config.hidden_size
  return (flops_per_image(image, image_size, num_patches=num_patches)
          + text.num_layers * block_flops(text, text_length, 0)
          + 2 * text.hidden_size * width
          + 2 * pairs * width)
