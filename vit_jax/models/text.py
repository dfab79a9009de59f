"""SigLIP's text tower (Zhai et al., ICCV 2023; big_vision's
text_transformer.py, transformers' SiglipTextModel): token ids [N, L] to
one embedding a text.

Each token's learned embedding plus a learned position embedding, the
image encoder's pre-norm blocks (models/encoder.py's Encoder, so scanning,
rematerialisation, the attention kinds and sharding are the image
tower's), a final LayerNorm, then the last token (texts are padded with
the end-of-text token, "sticky EOS", so the last is always one), through a
linear head to the embedding's width. Attention is bidirectional, over
padding too, as in SigLIP.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import layers, options, tokens as tokens_lib
from vit_jax.models.config import ViTConfig
from vit_jax.models.encoder import Encoder

# config.image_text's name of each TextSizes field: text_hidden_size, ...
SETTINGS_PREFIX = "text_"
TextSizes = options.transformer_sizes(
    "TextSizes", "the text tower's", (768, 12, 12, 3072), SETTINGS_PREFIX,
    "The text tower's sizes (SigLIP B's: 768 wide, 12 blocks, 12 heads, "
    "MLP 3072, 32,000 tokens, 64 a text): config.image_text's `text_*` "
    "keys are these fields (runs/objective_settings.py derives them).",
    __name__, extra=[
        ("vocab_size", int, options.key(
            32_000, "the tokenizer's vocabulary", at_least=2,
            before=options.AS_DEFAULT)),
        ("length", int, options.key(
            64, "tokens a text, padded or cut to it", at_least=1,
            before=options.AS_DEFAULT))])


def text_config(image_config, sizes):
  """The text tower's ViTConfig: the image tower's function (dtype,
  LayerNorm epsilon, GELU, scan, remat, attention) at the text's sizes,
  with a learned position table and none of an image's extra tokens,
  RoPE, layer scale or dropout."""
  return dataclasses.replace(
      image_config, hidden_size=sizes.hidden_size,
      num_layers=sizes.num_layers, num_heads=sizes.num_heads,
      mlp_dim=sizes.mlp_dim, posemb="learn", rope="", num_registers=0,
      distill_token=False, layer_scale=None, final_norm="tokens",
      resnet_stages=None, dropout_rate=0.0, attention_dropout_rate=0.0,
      drop_path_rate=0.0, classifier="token", representation_size=None)


class TextTransformer(nn.Module):
  """token ids [N, length] int -> float32 embeddings [N, embed_size] (not
  normalised)."""
  config: ViTConfig  # text_config's
  vocab_size: int
  embed_size: int

  @nn.compact
  def __call__(self, token_ids, *, train):
    config = self.config
    x = nn.Embed(
        self.vocab_size, config.hidden_size, param_dtype=config.param_dtype,
        embedding_init=layers.init(nn.initializers.normal(stddev=0.02),
                                   ("vocab", "embed")),
        name="token_embedding")(token_ids).astype(config.dtype)
    # A row of one grid: the learned table is [1, length, width].
    x = Encoder(config=config, name="Transformer")(
        tokens_lib.of_grid(x, (1, x.shape[1])), train=train)
    return nn.Dense(
        self.embed_size, dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=layers.init(nn.initializers.lecun_normal(),
                                ("embed", "classes")),
        bias_init=layers.init(nn.initializers.zeros, ("classes",)),
        name="head")(x[:, -1]).astype(jnp.float32)
