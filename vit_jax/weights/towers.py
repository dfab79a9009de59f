"""Two towers (models/two_towers.py) from each tower's params in the
release layout: what every two-tower reader ends in (transformers'
SiglipModel, weights/pytorch/siglip.py; big_vision's .npz,
weights/big_vision.py). The sizes come from the shapes."""

from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import numpy as np

from vit_jax import models
from vit_jax.models import text as text_lib, two_towers
from vit_jax.weights import npz
from vit_jax.weights.pytorch import files


class TwoTowersRead(NamedTuple):
  model: two_towers.TwoTowers
  params: Any  # {"img", "txt", "t", "b"}
  text_length: int
  normalization: files.Normalization


def assemble(image_flat, function, text_flat, t, b,
             normalization=files.HALF):
  """A TwoTowersRead of the image tower's and the text tower's flat
  release-layout params (unscanned), the image tower's `function`
  (models.FUNCTION_OPTIONS, which the text tower computes too), and t'
  and b."""
  image_params = flax.traverse_util.unflatten_dict(image_flat, sep="/")
  # The params say final_norm (an fc_norm or none).
  image_model, _ = models.from_params(
      {**image_params, "head": models.placeholder_head(image_params)},
      **{key: value for key, value in function.items()
         if key != "final_norm"})
  table = text_flat[models.POSEMB_KEY]
  block = "Transformer/encoderblock_{}/"
  query = text_flat[block.format(0)
                    + "MultiHeadDotProductAttention_1/query/kernel"]
  sizes = text_lib.TextSizes(
      hidden_size=table.shape[-1],
      num_layers=len({key.split("/")[1] for key in text_flat
                      if key.startswith("Transformer/encoderblock_")}),
      num_heads=int(query.shape[1]),
      mlp_dim=int(text_flat[block.format(0)
                            + "MlpBlock_3/Dense_0/kernel"].shape[1]),
      vocab_size=int(text_flat["token_embedding/embedding"].shape[0]),
      length=int(table.shape[1]))
  model = two_towers.TwoTowers(
      image_model.config, text_lib.text_config(image_model.config, sizes),
      sizes.vocab_size)
  params = {"img": image_params,
            "txt": flax.traverse_util.unflatten_dict(text_flat, sep="/"),
            "t": np.asarray(t, np.float32).reshape(1),
            "b": np.asarray(b, np.float32).reshape(1)}
  return TwoTowersRead(model, params, sizes.length, normalization)


def flat_towers(params):
  """(image, text) flat release-layout numpy params of a two-tower
  model's `params` (boxed or not; scanned blocks split per layer)."""
  return tuple(npz.unscan_blocks(flax.traverse_util.flatten_dict(
      jax.tree.map(np.asarray, nn.meta.unbox(params[tower])), sep="/"))
               for tower in ("img", "txt"))
