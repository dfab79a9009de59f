"""transformers' `ViTMAEForPreTraining` directories (masked autoencoders,
models/mae.py): config.json and model.safetensors, read into a
MaskedAutoencoder and its params, and written from them.

The encoder is HF's ViT under "vit." (layouts.py's "hf" layout, or
"hf5"), with its fixed sin-cos table stored in the file: it is read as a
learned table (posemb "learn", the class token's row included), because
its order is transformers' (and the original MAE's): [sin(column) |
cos(column) | sin(row) | cos(row)], where our "sincos2d" puts the row's
first. The decoder's blocks and final norm have HF ViT's names under their
own prefixes (read through the same "hf" layout, renamed), beside
`decoder_embed`, `mask_token`, its own fixed table `decoder_pos_embed`
(read as a learned one too) and `decoder_pred`. Its blocks compute with
the encoder's `hidden_act` and `layer_norm_eps`, as ours (mae.decoder_config)
do.

A model of ours written here gets its own tables: a "sincos2d" one (no
params) is written as our table at its grid with a zero class row, which
transformers then reads as stored, so it computes what ours does.
"""

import dataclasses
import json

import flax
import numpy as np

from vit_jax import errors, models, paths
from vit_jax.models import config as config_lib, mae as mae_lib, positions
from vit_jax.weights.pytorch import files, hf, layouts

MODEL_TYPE = "vit_mae"
ENCODER = "vit."
DECODER = "decoder/"  # Our decoder's params, under the encoder's.
# The decoder's blocks as the hub's files name them (transformers 4's
# conversion of facebookresearch/mae, and its save_pretrained), which is
# what is written, and as transformers 5.24's save_pretrained does (its
# renaming of `encoder.layer.` run backwards over `decoder_layers.`).
# transformers 5.24 loads both, transformers 4 the first only.
DECODER_BLOCKS = ("decoder.decoder_layers.", "decoder.decoder_encoder.layer.")
# The decoder's tensors that are HF ViT's once renamed (no prefix): its
# blocks, final norm and table.
DECODER_AS_VIT = {DECODER_BLOCKS[0]: "encoder.layer.",
                  "decoder.decoder_norm.": "layernorm.",
                  "decoder.decoder_pos_embed": "embeddings.position_embeddings"}
# Its Linears outside the blocks (torch's weight [out, in]), and its mask
# token, beside our decoder's.
DECODER_DENSE = {"decoder.decoder_embed": "embed",
                 "decoder.decoder_pred": "pred"}
MASK_TOKEN = ("decoder.mask_token", "mask_token")
# What every ViTMAEForPreTraining holds, in our names.
_EACH = (models.POSEMB_KEY, "Transformer/encoder_norm/scale",
         layouts.BLOCK.format(0) + layouts.ATTENTION + "/query/kernel",
         layouts.BLOCK.format(0) + "MlpBlock_3/Dense_0/kernel")
REQUIRED = ("embedding/kernel", "cls", *_EACH,
            *(DECODER + key for key in _EACH))


def read_mae(directory):
  """(MaskedAutoencoder, params (numpy float32, nested), norm_pix_loss) of
  a transformers ViTMAEForPreTraining directory, local or a URL."""
  model, tensors = hf.read_tensors(directory)
  config = model.config
  if config.get("model_type") != MODEL_TYPE:
    raise errors.InputError(
        f"{directory}: model_type {config.get('model_type')!r}; a masked "
        f"autoencoder is transformers' ViTMAEForPreTraining "
        f"({MODEL_TYPE!r})")
  decoder = {name: tensors.pop(name) for name in list(tensors)
             if name.startswith("decoder.")}
  if not decoder:
    raise errors.InputError(
        f"{directory} holds no decoder (a ViTMAEModel): its encoder is a ViT "
        "that pretrained.for_inference and config.init_from read")
  layout = ("hf5" if any(k.startswith(ENCODER + "layers.") for k in tensors)
            else "hf")
  qkv_bias = config.get("qkv_bias", True)
  flat = _vit_to_release(tensors, layout, ENCODER,
                         config.get("num_attention_heads", 12), qkv_bias)
  flat.update({DECODER + key: value for key, value in _decoder_to_release(
      decoder, layout, config.get("decoder_num_attention_heads", 16),
      qkv_bias).items()})
  flat = {key: np.asarray(value, np.float32) for key, value in flat.items()}
  missing = [key for key in REQUIRED if key not in flat]
  if missing:
    raise errors.InputError(f"{directory} is no whole ViTMAEForPreTraining: "
                            f"nothing reads as {missing}")
  sizes = files.sizes(flat)
  if flat[DECODER + "pred/kernel"].shape[1] != sizes["patch_size"] ** 2 * 3:
    raise errors.InputError(
        f"{directory}: decoder_pred predicts "
        f"{flat[DECODER + 'pred/kernel'].shape[1]} values a patch, not the "
        f"{sizes['patch_size'] ** 2 * 3} of an RGB patch")
  tables = {flat[key].shape[1] for key in (models.POSEMB_KEY,
                                           DECODER + models.POSEMB_KEY)}
  if len(tables) != 1:
    raise errors.InputError(f"{directory}: the encoder's and the decoder's "
                            "position tables are of different grids")
  function = {key: value for key, value in model.function.items()
              if key != "final_norm"}
  encoder = models.ViTConfig(
      patch_size=sizes["patch_size"], hidden_size=sizes["hidden_size"],
      num_layers=sizes["num_layers"], num_heads=sizes["num_heads"],
      mlp_dim=sizes["mlp_dim"], classifier="token", posemb="learn",
      **function)
  decoder_sizes = mae_lib.DecoderSizes(
      hidden_size=int(flat[DECODER + "embed/kernel"].shape[1]),
      num_layers=len({key.split("/")[2] for key in flat if key.startswith(
          DECODER + "Transformer/encoderblock_")}),
      num_heads=int(flat[DECODER + layouts.BLOCK.format(0) + layouts.ATTENTION
                         + "/query/kernel"].shape[1]),
      mlp_dim=int(flat[DECODER + layouts.BLOCK.format(0)
                       + "MlpBlock_3/Dense_0/kernel"].shape[1]))
  mae = mae_lib.MaskedAutoencoder(
      encoder, dataclasses.replace(
          mae_lib.decoder_config(encoder, decoder_sizes), posemb="learn"),
      float(config.get("mask_ratio", 0.75)))
  mae.check_options()
  config_lib.check(mae.decoder)
  return (mae, flax.traverse_util.unflatten_dict(flat, sep="/"),
          bool(config.get("norm_pix_loss", False)))


def _vit_to_release(tensors, layout, prefix, num_heads, qkv_bias):
  """layouts.to_release of HF ViT `tensors`, with zero query, key and value
  biases where the config says they have none (which computes the same)."""
  tensors = dict(tensors)
  if not qkv_bias:
    for key in layouts.qkv_weights(layout, layouts.num_layers_of(
        tensors, layout, prefix), prefix):
      if key in tensors:
        tensors[key[:-len("weight")] + "bias"] = np.zeros(
            tensors[key].shape[0], tensors[key].dtype)
  return layouts.to_release(tensors, layout, num_heads, prefix)


def _decoder_to_release(tensors, layout, num_heads, qkv_bias):
  """Our decoder's flat params (without `DECODER`) of the decoder's
  tensors: its blocks, norm and table renamed to HF ViT's names and read
  as those are, its Linears and mask token as they are."""
  tensors = dict(tensors)
  flat = {}
  for name, module in DECODER_DENSE.items():
    if name + ".weight" not in tensors or name + ".bias" not in tensors:
      raise errors.InputError(f"a ViTMAEForPreTraining has {name}.weight "
                              f"and {name}.bias; this file lacks one")
    flat[module + "/kernel"] = tensors.pop(name + ".weight").T
    flat[module + "/bias"] = tensors.pop(name + ".bias")
  if MASK_TOKEN[0] not in tensors:
    raise errors.InputError(f"a ViTMAEForPreTraining has {MASK_TOKEN[0]}; "
                            "this file lacks it")
  flat[MASK_TOKEN[1]] = tensors.pop(MASK_TOKEN[0])
  renamed = {}
  for name, value in tensors.items():
    for theirs, vit in ((DECODER_BLOCKS[1], DECODER_BLOCKS[0]),
                        *DECODER_AS_VIT.items()):
      if name.startswith(theirs):
        name = vit + name[len(theirs):]
    if layout == "hf5":  # transformers 5's module names of the blocks.
      name = name.replace("encoder.layer.", layouts.LAYOUTS["hf5"]["blocks"])
    renamed[name] = value
  flat.update(_vit_to_release(renamed, layout, "", num_heads, qkv_bias))
  return flat


def cannot_write(model):
  """What of MaskedAutoencoder `model` transformers' ViTMAEForPreTraining
  cannot hold: it computes a ViT of HF's (class token, a position table,
  LayerNorms, GELU MLPs) and a decoder of the encoder's function."""
  cannot = []
  for name, config in (("encoder", model.config), ("decoder", model.decoder)):
    for part, has in (
        ("a hybrid's ResNet stem", config.resnet_stages is not None),
        (f"posemb {config.posemb!r} (it takes 'learn' or 'sincos2d')",
         config.posemb not in ("learn", "sincos2d")),
        (f"rope {config.rope!r}", bool(config.rope)),
        ("layer scale", config.layer_scale is not None),
        ("registers", bool(config.num_registers)),
        ("a distillation token", config.distill_token),
        ("query/key norms", config.qk_norm),
        ("a SwiGLU MLP", config.mlp == "swiglu"),
        ("final_norm 'pooled'", config.final_norm == "pooled")):
      if has:
        cannot.append(f"{part} in its {name}")
  if model.config.classifier != "token":
    cannot.append(f"classifier {model.config.classifier!r} (it takes "
                  "'token')")
  for name in ("layer_norm_epsilon", "gelu"):
    if getattr(model.decoder, name) != getattr(model.config, name):
      cannot.append(f"a decoder {name} ({getattr(model.decoder, name)!r}) "
                    f"other than its encoder's "
                    f"({getattr(model.config, name)!r})")
  return cannot


def write_mae(directory, model, params, norm_pix_loss, image_size=None):
  """A transformers ViTMAEForPreTraining directory (config.json and
  model.safetensors, each replaced whole) of MaskedAutoencoder `model`
  with `params`. `image_size`: the side it computes at, where neither
  model has a learned position table to say it."""
  cannot = cannot_write(model)
  if cannot:
    raise errors.InputError(
        f"transformers' ViTMAEForPreTraining cannot hold this masked "
        f"autoencoder: it has {'; '.join(cannot)}")
  flat = {key: np.asarray(value) for key, value in
          flax.traverse_util.flatten_dict(params, sep="/").items()}
  encoder, decoder = model.config, model.decoder
  side = _grid_side(flat, encoder.patch_size, image_size)
  for prefix, config in (("", encoder), (DECODER, decoder)):
    if config.posemb == "sincos2d":  # Ours, as transformers will read it.
      flat[prefix + models.POSEMB_KEY] = np.concatenate([
          np.zeros((1, config.hidden_size), np.float32),
          positions.sincos2d_table(side, side, config.hidden_size)])[None]
  tensors = layouts.from_release(
      {key: value for key, value in flat.items()
       if not key.startswith(DECODER)}, "hf", prefix=ENCODER)
  tensors.update(_decoder_tensors({key[len(DECODER):]: value
                                   for key, value in flat.items()
                                   if key.startswith(DECODER)}))
  config = {
      "architectures": ["ViTMAEForPreTraining"], "model_type": MODEL_TYPE,
      "hidden_size": encoder.hidden_size,
      "num_hidden_layers": encoder.num_layers,
      "num_attention_heads": encoder.num_heads,
      "intermediate_size": encoder.mlp_dim,
      "hidden_act": hf.HF_ACT[encoder.gelu],
      "layer_norm_eps": encoder.layer_norm_epsilon,
      "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
      "initializer_range": 0.02, "image_size": side * encoder.patch_size,
      "patch_size": encoder.patch_size, "num_channels": 3, "qkv_bias": True,
      "decoder_hidden_size": decoder.hidden_size,
      "decoder_num_hidden_layers": decoder.num_layers,
      "decoder_num_attention_heads": decoder.num_heads,
      "decoder_intermediate_size": decoder.mlp_dim,
      "mask_ratio": model.mask_ratio, "norm_pix_loss": bool(norm_pix_loss),
  }
  files.write_safetensors(tensors, paths.join(directory, hf.HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, hf.HF_CONFIG),
                         json.dumps(config, indent=2))


def _grid_side(flat, patch_size, image_size):
  """The side of the square grid of patches: a learned table's, else
  `image_size`'s."""
  sides = {models.grid_side(flat[key].shape[1] - 1, key)
           for key in (models.POSEMB_KEY, DECODER + models.POSEMB_KEY)
           if key in flat}
  if image_size is not None:
    if image_size % patch_size:
      raise errors.InputError(f"image_size {image_size} is no multiple of "
                              f"the patch size {patch_size}")
    sides.add(image_size // patch_size)
  if not sides:
    raise errors.InputError(
        "a masked autoencoder with no learned position table says no image "
        "size: give image_size")
  if len(sides) > 1:
    raise errors.InputError(
        f"the position tables and image_size give different grids: "
        f"{sorted(sides)} patches a side")
  return sides.pop()


def _decoder_tensors(flat):
  """The decoder's tensors of our decoder's flat params (without
  `DECODER`): `_decoder_to_release`'s inverse, in the hub's names."""
  flat = dict(flat)
  tensors = {}
  for name, module in DECODER_DENSE.items():
    tensors[name + ".weight"] = np.ascontiguousarray(
        flat.pop(module + "/kernel").T)
    tensors[name + ".bias"] = flat.pop(module + "/bias")
  tensors[MASK_TOKEN[0]] = flat.pop(MASK_TOKEN[1])
  for name, value in layouts.from_release(flat, "hf").items():
    for ours, vit in DECODER_AS_VIT.items():
      if name.startswith(vit):
        name = ours + name[len(vit):]
        break
    tensors[name] = value
  return tensors
