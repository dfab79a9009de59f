"""Self-distillation's model (DINO, Caron et al. 2021; DINOv2, Oquab et al.
2024): a ViT backbone with DINO's projection head on its class token and
iBOT's on its patch tokens (the same head, or one of its own).

The backbone is models/encoder.py's ImageEncoder with a learned [mask]
embedding, which iBOT puts in place of a global crop's masked patches
before the position embedding (DINOv2's `prepare_tokens_with_masks`); its
outputs are the class token and the patch tokens after the final norm
(DINOv2's x_norm_clstoken and x_norm_patchtokens). Square images go in at
the grid of the position table; crops of another size (the local crops)
go in as NaFlex patches (naflex.Patches), whose learned table is resized
to their grid: a crop costs its own tokens and no padding.

A DINO head: `layers` - 1 dense layers of `hidden_size` with exact GELUs,
one to `bottleneck` (truncated normal draws of std 0.02, zero biases),
the output L2-normalised, then `prototypes` weight-normalised prototypes:
logits = x . (g_k v_k / |v_k|), v drawn as torch's Linear draws it and g
starting at 1 (DINOv2's DINOHead, weight_norm's weight_v and weight_g).

The params: the backbone's in the release layout (embedding, cls,
Transformer, mask_embedding), so `init_from`, `export` and `features`
read it as any ViT (weights/adaptation drops the heads and the mask
embedding); the heads' under `dino_head` and `ibot_head`.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import layers, masked_patches, naflex, options
from vit_jax.models.config import ViTConfig
from vit_jax.models.encoder import ImageEncoder

# config.dino's keys for the head sizes: these fields, prefixed.
SETTINGS_PREFIX = "head_"
NORMALISE_EPSILON = 1e-12  # DINOHead's (float32)
HEADS = ("dino_head", "ibot_head")  # the params' names of the heads
HEAD_INIT_STD = 0.02


@dataclasses.dataclass(frozen=True)
class HeadSizes:
  """A DINO head's sizes (DINOv2's defaults), declared here once:
  config.dino's `head_*` keys are these fields (runs/objective_settings.py
  derives them)."""
  prototypes: int = options.key(65536, "the prototypes K (DINOv2's "
                                "released L/g: 131072)", at_least=1,
                                before=options.AS_DEFAULT)
  hidden_size: int = options.key(2048, "the head's hidden width",
                                 at_least=1, before=options.AS_DEFAULT)
  bottleneck: int = options.key(256, "the width before the prototypes "
                                "(DINOv2's released L/g: 384)", at_least=1,
                                before=options.AS_DEFAULT)
  layers: int = options.key(3, "the head's dense layers before the "
                            "prototypes", at_least=1,
                            before=options.AS_DEFAULT)

  @classmethod
  def of(cls, keys):
    """The sizes config.dino's `keys` give."""
    return options.sizes_of(cls, keys, SETTINGS_PREFIX)


def _torch_linear_init(key, shape, dtype=jnp.float32):
  """torch's nn.Linear default draw of a [fan_in, out] kernel:
  U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1 / math.sqrt(shape[0])
  return jax.random.uniform(key, shape, dtype, -bound, bound)


class DinoHead(nn.Module):
  """[..., D] -> float32 logits [..., K] (the module docstring)."""
  sizes: HeadSizes
  param_dtype: jnp.dtype = jnp.float32
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    sizes = self.sizes
    init = nn.initializers.truncated_normal(HEAD_INIT_STD)
    for i in range(sizes.layers):
      last = i == sizes.layers - 1
      x = nn.Dense(
          sizes.bottleneck if last else sizes.hidden_size, dtype=self.dtype,
          param_dtype=self.param_dtype,
          kernel_init=layers.init(init, ("embed", "mlp") if i == 0
                                  else ("mlp", None)),
          bias_init=layers.init(nn.initializers.zeros,
                                (None,) if last else ("mlp",)),
          name=f"Dense_{i}")(x)
      if not last:
        x = nn.gelu(x, approximate=False)
    x = x.astype(jnp.float32)
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True),
                        NORMALISE_EPSILON)
    directions = self.param(
        "prototypes", layers.init(_torch_linear_init, (None, "prototypes")),
        (sizes.bottleneck, sizes.prototypes), self.param_dtype)
    scale = self.param("prototype_scale",
                       layers.init(nn.initializers.ones, ("prototypes",)),
                       (sizes.prototypes,), self.param_dtype)
    directions = directions.astype(jnp.float32)
    weights = directions * (scale.astype(jnp.float32) / jnp.linalg.norm(
        directions, axis=0))
    return x @ weights


class SelfDistillationModel(nn.Module):
  """A backbone with a DINO head and, where `separate_ibot_head`, iBOT's
  own. `__call__` (what init traces) runs all of them."""
  config: ViTConfig
  head: HeadSizes
  separate_ibot_head: bool = False

  @nn.nowrap
  def check_options(self):
    if self.config.resnet_stages is not None:
      raise errors.InputError("self-distillation's backbone embeds pixels' "
                              "patches: it takes no hybrid ResNet stem")
    if not self.config.class_token:
      raise errors.InputError(
          "self-distillation reads the class token (DINO's head sits on "
          "it): classifier must be 'token'")

  @property
  def token_stride(self):
    return self.config.patch_size

  def describe_patch(self):
    return f"patch size {self.config.patch_size}"

  def setup(self):
    self.encoder = ImageEncoder(config=self.config, mask_token=True)
    nn.share_scope(self, self.encoder)
    dtypes = dict(dtype=self.config.dtype, param_dtype=self.config.param_dtype)
    self.dino_head = DinoHead(self.head, name="dino_head", **dtypes)
    self.ibot_head = (DinoHead(self.head, name="ibot_head", **dtypes)
                      if self.separate_ibot_head else self.dino_head)

  def __call__(self, images, *, train=False):
    class_tokens, patches = self.backbone(images, train=train)
    return self.dino_head(class_tokens), self.ibot_head(patches)

  def backbone(self, images, *, train=False, masks=None):
    """(class tokens [N, D], patch tokens [N, L, D]) after the final norm;
    `masks` [N, L] bool: the patches iBOT puts the [mask] embedding in
    place of (square images only)."""
    corruption = None
    if masks is not None:
      own = jnp.broadcast_to(jnp.arange(masks.shape[1]), masks.shape)
      corruption = masked_patches.Corruption(own, masks, masks)
    tokens = self.encoder(images, train=train, corruption=corruption)
    return tokens.values[:, 0], tokens.patches

  def project(self, tokens):
    """DINO's head on class tokens [..., D]: logits [..., K]."""
    return self.dino_head(tokens)

  def project_patches(self, tokens):
    """iBOT's head on patch tokens [..., D]: logits [..., K]."""
    return self.ibot_head(tokens)


def backbone_params(params):
  """`params` of a SelfDistillationModel without its heads: what its
  `backbone` method reads."""
  return {name: value for name, value in params.items()
          if name not in HEADS}


def crops_as_patches(images, patch_size):
  """naflex.Patches of square crops [N, S, S, 3] (S a multiple of the patch
  size): every patch real, row by row, flattened as NaFlex flattens it, so
  that crops of another size than the position table's go in at their own
  grid."""
  n, side = images.shape[0], images.shape[1]
  grid = side // patch_size
  pixels = images.reshape(n, grid, patch_size, grid, patch_size, 3)
  pixels = pixels.transpose(0, 1, 3, 2, 4, 5).reshape(
      n, grid * grid, patch_size * patch_size * 3)
  return naflex.Patches(pixels, jnp.full((n, 2), grid, jnp.int32))
