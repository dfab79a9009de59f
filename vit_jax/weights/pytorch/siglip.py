"""transformers' two-tower SigLIP (`SiglipModel`, and SigLIP 2's
`Siglip2Model`, whose image tower is NaFlex's: `vision_model.`,
`text_model.`, `logit_scale`, `logit_bias`), read whole into
models/two_towers.py's TwoTowers and written back.

The image tower reads as hf.py reads a SigLIP vision tower (alone, the
SigLIP families of tests/test_recorded_libraries.py); the text tower is
layouts.py's "siglip_text"; logit_scale and logit_bias are t' and b. The
text length is the position table's (`max_position_embeddings`): the
checkpoint's texts are padded to it. Both towers compute transformers'
function of the file's config (GELU, LayerNorm epsilon), which must be
one for the two.
"""

import json

import numpy as np

from vit_jax import errors, models, paths
from vit_jax.weights import towers
from vit_jax.weights.pytorch import files, hf, layouts

TEXT_PREFIX, VISION_PREFIX = "text_model.", "vision_model."
# model_type -> (the class, its towers' model_types, the image tower's
# layout: SigLIP 2 embeds flattened patches with a Linear).
KINDS = {"siglip": ("SiglipModel", "siglip_vision_model",
                    "siglip_text_model", "siglip"),
         "siglip2": ("Siglip2Model", "siglip2_vision_model",
                     "siglip2_text_model", "siglip2")}


def is_two_towers(directory):
  """Whether `directory` is an HF directory of a SiglipModel or a
  Siglip2Model (both towers)."""
  if not hf.is_hf_dir(directory):
    return False
  config = files.read_json(paths.join(directory, hf.HF_CONFIG))
  return config.get("model_type") in KINDS and "text_config" in config


def read_two_towers(directory):
  """The SiglipModel or Siglip2Model in `directory` (`is_two_towers`) as a
  TwoTowersRead."""
  image = hf.read_hf(directory)  # Its vision tower, alone.
  _, tensors = hf.read_tensors(directory)
  config = files.read_json(paths.join(directory, hf.HF_CONFIG))
  text = config["text_config"]
  act = text.get("hidden_act", "gelu_pytorch_tanh")
  epsilon = float(text.get("layer_norm_eps", 1e-6))
  if (hf.HF_GELU.get(act), epsilon) != (image.function["gelu"],
                                        image.function["layer_norm_epsilon"]):
    raise errors.InputError(
        f"{directory}: the text tower computes {act} with LayerNorm epsilon "
        f"{epsilon}, the image tower otherwise: vit_jax's two towers share "
        "one function")
  text_tensors = {key[len(TEXT_PREFIX):]: value
                  for key, value in tensors.items()
                  if key.startswith(TEXT_PREFIX)}
  heads = int(text.get("num_attention_heads", 12))
  return towers.assemble(
      image.flat, image.function,
      layouts.to_release(text_tensors, "siglip_text", heads),
      tensors["logit_scale"], tensors["logit_bias"], image.normalization)


def write_two_towers(directory, model, params, kind="siglip"):
  """A SiglipModel (`kind` "siglip") or Siglip2Model ("siglip2")
  directory of a TwoTowers `model` with `params` whose image tower
  transformers' SigLIP computes (hf.write_siglip2 says which; its
  position table a square)."""
  architecture, vision_type, text_type, layout = KINDS[kind]
  image, text = towers.flat_towers(params)
  function = {key: getattr(model.config, key)
              for key in models.FUNCTION_OPTIONS}
  what, target = "the two-tower model", f"as a {architecture}"
  if not hf.is_siglip_tower(image):
    raise errors.InputError(
        f"{what} cannot be written {target}: its image tower must pool "
        "with a MAP head and no class token (config.model.classifier "
        "'map')")
  hf.refuse_unwritable_siglip(image, function, what, target)
  sizes = files.sizes(image)
  posemb = image[models.POSEMB_KEY]
  side = models.grid_side(posemb.shape[1], models.POSEMB_KEY)
  text_config = model.text
  shared = {"hidden_act": hf.HF_ACT[function["gelu"]],
            "layer_norm_eps": function["layer_norm_epsilon"],
            "attention_dropout": 0.0}
  # SigLIP 2's table is resized to each image's grid: its size, not an
  # image size, says it.
  grid = ({"num_patches": side * side} if kind == "siglip2" else
          {"image_size": side * sizes["patch_size"]})
  config = {
      "architectures": [architecture], "model_type": kind,
      "vision_config": {
          "model_type": vision_type,
          "hidden_size": sizes["hidden_size"],
          "intermediate_size": sizes["mlp_dim"],
          "num_hidden_layers": sizes["num_layers"],
          "num_attention_heads": sizes["num_heads"], "num_channels": 3,
          **grid, "patch_size": sizes["patch_size"], **shared},
      "text_config": {
          "model_type": text_type,
          "hidden_size": text_config.hidden_size,
          "intermediate_size": text_config.mlp_dim,
          "num_hidden_layers": text_config.num_layers,
          "num_attention_heads": text_config.num_heads,
          "vocab_size": model.vocab_size,
          "max_position_embeddings": int(
              text[models.POSEMB_KEY].shape[1]),
          "projection_size": model.config.hidden_size, **shared},
  }
  tensors = {VISION_PREFIX + name.replace("in_proj.", "in_proj_"): value
             for name, value in layouts.from_release(image, layout).items()}
  tensors.update({TEXT_PREFIX + name: value for name, value in
                  layouts.from_release(text, "siglip_text").items()})
  tensors.update({"logit_scale": np.asarray(params["t"], np.float32).reshape(1),
                  "logit_bias": np.asarray(params["b"], np.float32).reshape(1)})
  files.write_safetensors(tensors, paths.join(directory, hf.HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, hf.HF_CONFIG),
                         json.dumps(config, indent=2))
