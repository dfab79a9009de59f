"""Two towers, an image's and a text's, and the learned temperature and
bias that score their pairs (SigLIP; big_vision's two_towers.py, whose
parameter names this keeps: img, txt, t, b).

The image tower is any VisionTransformer, read through its pooling (the
class token, the patches' mean or a MAP head) without a classifier head:
its pooled width is the embedding's (SigLIP's image towers have no
projection). The text tower (models/text.py) projects to that width. A
pair's logit is t * <z_img, z_txt> + b over L2-normalised embeddings, with
t = exp(t') learned in log space; SigLIP starts at t' = log 10, b = -10.
"""

import math

import flax.linen as nn
import flax.struct
import jax.numpy as jnp

from vit_jax.models import layers, text as text_lib
from vit_jax.models.config import ViTConfig
from vit_jax.models.vit import VisionTransformer

# SigLIP's initial temperature and bias (Section 3.2 of the paper).
TEMPERATURE_INIT = 10.0
BIAS_INIT = -10.0


def normalize(x):
  """Rows over their L2 norm (a zero row stays zero), float32."""
  x = x.astype(jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@flax.struct.dataclass
class Embedded:
  """What the towers give a batch: normalised embeddings [N, D] of the
  images and the texts, and the scale t = exp(t') and bias b."""
  images: jnp.ndarray
  texts: jnp.ndarray
  scale: jnp.ndarray
  bias: jnp.ndarray

  def logits(self):
    """[images, texts]: each image's logit against each text."""
    return self.images @ self.texts.T * self.scale + self.bias


class TwoTowers(nn.Module):
  """Called with images (NHWC, [-1, 1] or uint8; or NaFlex patches) and
  token ids [N, length]: an Embedded. `embed_images` and `embed_texts`
  run one tower."""
  config: ViTConfig  # the image tower's
  text: ViTConfig  # text_lib.text_config's
  vocab_size: int
  temperature_init: float = TEMPERATURE_INIT
  bias_init: float = BIAS_INIT

  def setup(self):
    self.img = VisionTransformer(num_classes=0, config=self.config)
    self.txt = text_lib.TextTransformer(
        config=self.text, vocab_size=self.vocab_size,
        embed_size=self.config.hidden_size)
    scalar = lambda value: layers.init(nn.initializers.constant(value),
                                       (None,))
    self.t = self.param("t", scalar(math.log(self.temperature_init)), (1,),
                        jnp.float32)
    self.b = self.param("b", scalar(self.bias_init), (1,), jnp.float32)

  @property
  def token_stride(self):
    return self.config.patch_size

  def describe_patch(self):
    return f"patch size {self.config.patch_size}"

  @nn.nowrap
  def check_options(self):
    VisionTransformer(num_classes=0, config=self.config).check_options()

  def __call__(self, images, token_ids, *, train):
    return Embedded(self.embed_images(images, train=train),
                    self.embed_texts(token_ids, train=train),
                    jnp.exp(self.t[0]), self.b[0])

  def embed_images(self, images, *, train=False):
    """[N, D] normalised image embeddings."""
    return normalize(self.img(images, train=train, pre_logits=True))

  def embed_texts(self, token_ids, *, train=False):
    """[N, D] normalised text embeddings."""
    return normalize(self.txt(token_ids, train=train))
