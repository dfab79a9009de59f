"""Writing a self-distilled backbone (a run of objective "dino") and any
DINOv3-family model to transformers: Dinov2Model (or
Dinov2WithRegistersModel, DINOv2-g's SwiGLU) and DINOv3ViTModel
directories, each with the image processor of the input its params take.
Reading these families is hf.py's."""

import json

import numpy as np

from vit_jax import models, paths
from vit_jax.models import dino as dino_lib
from vit_jax.weights.pytorch import eva, files, layouts
from vit_jax.weights.pytorch.hf import (
    HF_ACT,
    HF_CONFIG,
    HF_PREPROCESSOR,
    HF_WEIGHTS,
)


def dinov2_mlp_ratio(width, mlp_dim):
  """The whole mlp_ratio whose SwiGLU hidden width (two thirds of ratio x
  width, rounded up to a multiple of 8, as transformers' Dinov2SwiGLUFFN
  and dinov2's SwiGLUFFNFused size it) is `mlp_dim`, or None."""
  for ratio in range(1, 17):
    if (int(width * ratio * 2 / 3) + 7) // 8 * 8 == mlp_dim:
      return ratio
  return None


def _dinov3_cannot(flat, function):
  """What of release-layout `flat`, computing `function`, DINOv3's layouts
  (transformers' DINOv3ViTModel, timm's DINOv3 Evas) cannot hold."""
  cannot = eva.eva_family_cannot(flat)
  if models.POSEMB_KEY in flat:
    cannot.append("a position table")
  if not function["rope"]:
    cannot.append("no 2-D rotary embeddings (rope 'axial')")
  elif function["rope"] != "axial":
    cannot.append(f"rope {function['rope']!r}, where DINOv3's is 'axial' "
                  "(--format=timm writes timm's RoPE ViTs)")
  return cannot


def write_dinov3(directory, flat, function, image_size, what,
                 normalization=files.HALF, mask=None):
  """An HF transformers DINOv3ViTModel directory of a model with 2-D RoPE
  and no position table (DINOv3's family), with the image processor of
  its input (`normalization`: a run's [-1, 1], a source's own) and `mask`
  (a self-distilled run's [mask] embedding, else zeros) as its mask
  token; returns the number of classes of the head it leaves out (the
  family has no classifier), or 0. Every
  projection is written with its bias but a key's where the model has
  none (`key_bias`), and a model without layer scale gets scales of ones,
  which compute the same. A model that pools the patch tokens and has no
  class token writes its first register as the class token, as
  `eva.write_eva` does: DINOv3ViTModel's class token and registers are
  the same kind of token (none rotated), so the patch tokens compute the
  same."""
  cannot = _dinov3_cannot(flat, function)
  if "cls" not in flat and layouts.REGISTERS not in flat:
    cannot.append("neither a class token nor a register to write as one")
  files.refuse(what, "as a DINOv3ViTModel", cannot)
  sizes = files.sizes(flat)
  flat = dict(flat)
  if "cls" not in flat:
    registers = flat.pop(layouts.REGISTERS)
    flat["cls"] = registers[:, :1]
    if registers.shape[1] > 1:
      flat[layouts.REGISTERS] = registers[:, 1:]
  flat.pop("head/kernel", None)
  flat.pop("head/bias", None)
  width = sizes["hidden_size"]
  dtype = flat["embedding/kernel"].dtype
  for i in range(sizes["num_layers"]):
    for scale in ("ls1", "ls2"):
      flat.setdefault(layouts.BLOCK.format(i) + scale,
                      np.ones(width, dtype))
  registers = flat.get(layouts.REGISTERS)
  architecture = models.architecture_of(flat)
  gated = architecture["mlp"] == "swiglu"
  tensors = layouts.from_release(flat, "dinov3")
  if not architecture["key_bias"]:  # from_release's zeros.
    for i in range(sizes["num_layers"]):
      del tensors[f"layer.{i}.attention.k_proj.bias"]
  # The masked-image-modelling token, which inference does not read.
  tensors["embeddings.mask_token"] = (
      np.zeros((1, 1, width), dtype) if mask is None
      else np.asarray(mask, dtype).reshape(1, 1, width))
  config = {
      "architectures": ["DINOv3ViTModel"], "model_type": "dinov3_vit",
      "hidden_size": width, "intermediate_size": sizes["mlp_dim"],
      "num_hidden_layers": sizes["num_layers"],
      "num_attention_heads": sizes["num_heads"],
      "hidden_act": "silu" if gated else HF_ACT[function["gelu"]],
      "layer_norm_eps": function["layer_norm_epsilon"],
      "rope_theta": function["rope_theta"], "image_size": int(image_size),
      "patch_size": sizes["patch_size"], "num_channels": 3,
      "query_bias": True,
      "key_bias": architecture["key_bias"], "value_bias": True,
      "proj_bias": True,
      "mlp_bias": True, "layerscale_value": 1.0, "use_gated_mlp": gated,
      "num_register_tokens": 0 if registers is None else int(
          registers.shape[1]),
      "pos_embed_shift": None, "pos_embed_jitter": None,
      "pos_embed_rescale": None,
  }
  files.write_safetensors(tensors, paths.join(directory, HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, HF_CONFIG),
                         json.dumps(config, indent=2))
  # DINOv3ViTImageProcessor's own sizing: a bilinear resize to the side.
  write_processor(directory, {
      "image_processor_type": "DINOv3ViTImageProcessor",
      "size": {"height": int(image_size), "width": int(image_size)},
      "resample": 2}, normalization)
  return sizes["num_classes"]


# What self-distillation's pre-training adds to the backbone: its heads
# (models/dino.py), which a Dinov2Model has no place for.
DINO_HEADS = tuple(f"{head}/" for head in dino_lib.HEADS)  # flat keys
MASK_EMBEDDING = "mask_embedding"


def dino_backbone(flat):
  """(the backbone's params, its [mask] embedding or None) of a
  self-distilled run's flat params: its heads and [mask] embedding, which
  only training reads, taken out (write_dinov2 and write_dinov3 write the
  embedding as the model's mask token; timm's model has no place for
  it)."""
  backbone = {key: value for key, value in flat.items()
              if not key.startswith(DINO_HEADS) and key != MASK_EMBEDDING}
  return backbone, flat.get(MASK_EMBEDDING)


def write_dinov2(directory, flat, function, what, mask=None):
  """An HF transformers Dinov2Model (Dinov2WithRegistersModel where it has
  registers) directory of a self-distilled backbone (a run of objective
  "dino", its heads left out: dino_backbone): `mask`, its learned [mask]
  embedding, written as the model's mask token (else zeros), layer scales
  of ones where it has none (which compute the same), a SwiGLU MLP (the
  released recipes') as DINOv2-g's (use_swiglu_ffn). Returns the class
  written."""
  cannot = files.function_cannot(function)
  if "conv_root/kernel" in flat:
    cannot.append("a hybrid's ResNet stem")
  if models.POSEMB_KEY not in flat:
    cannot.append("a position embedding other than 'learn'")
  if "cls" not in flat:
    cannot.append("no class token (classifier 'gap')")
  for key, part in (("head/kernel", "a classification head"),
                    ("pre_logits/kernel", "a pre-logits layer"),
                    ("fc_norm/scale", "final_norm 'pooled'"),
                    ("dist", "a distillation token"),
                    (layouts.MAP_PROBE, "attention pooling"),
                    (layouts.BLOCK.format(0) + layouts.ATTENTION
                     + "/query_norm/scale", "query/key norms")):
    if key in flat:
      cannot.append(part)
  sizes = files.sizes(flat)
  width = sizes["hidden_size"]
  gated = models.architecture_of(flat)["mlp"] == "swiglu"
  # Dinov2Config's mlp_ratio is an int; a SwiGLU's width is 2/3 of it.
  ratio = (dinov2_mlp_ratio(width, sizes["mlp_dim"]) if gated else
           None if sizes["mlp_dim"] % width else sizes["mlp_dim"] // width)
  if ratio is None:
    cannot.append(
        f"{'a SwiGLU' if gated else 'an'} MLP of {sizes['mlp_dim']}, which "
        f"no whole mlp_ratio of its width {width} gives")
  files.refuse(what, "as a Dinov2Model", cannot)
  dtype = flat["embedding/kernel"].dtype
  for i in range(sizes["num_layers"]):
    for scale in ("ls1", "ls2"):
      flat.setdefault(layouts.BLOCK.format(i) + scale, np.ones(width, dtype))
  registers = flat.get(layouts.REGISTERS)
  if gated:
    tensors = layouts.swiglu_fused(layouts.from_release(flat, "dinov2_swiglu"))
  else:
    tensors = layouts.from_release(flat, "dinov2")
  tensors["embeddings.mask_token"] = (
      np.zeros((1, width), dtype) if mask is None
      else np.asarray(mask, dtype).reshape(1, width))
  kind = "Dinov2Model" if registers is None else "Dinov2WithRegistersModel"
  config = {
      "architectures": [kind],
      "model_type": "dinov2" if registers is None
                    else "dinov2_with_registers",
      "hidden_size": width, "num_hidden_layers": sizes["num_layers"],
      "num_attention_heads": sizes["num_heads"],
      "mlp_ratio": ratio,
      "hidden_act": HF_ACT[function["gelu"]],
      "layer_norm_eps": function["layer_norm_epsilon"],
      "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
      "initializer_range": 0.02, "image_size": sizes["image_size"],
      "patch_size": sizes["patch_size"], "num_channels": 3,
      "qkv_bias": True, "layerscale_value": 1.0, "drop_path_rate": 0.0,
      "use_swiglu_ffn": gated,
  }
  if registers is not None:
    config["num_register_tokens"] = int(registers.shape[1])
  # The input it was trained on, [-1, 1] (pixels / 255 - 0.5) / 0.5, for
  # transformers' image processor (DINOv2's default is ImageNet's).
  side = sizes["image_size"]
  files.write_safetensors(tensors, paths.join(directory, HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, HF_CONFIG),
                         json.dumps(config, indent=2))
  write_processor(directory, {
      "image_processor_type": "BitImageProcessor",
      "size": {"shortest_edge": side}, "resample": 3,
      "do_center_crop": True, "crop_size": {"height": side, "width": side}},
                  files.HALF)
  return kind


def write_processor(directory, resizing, normalization):
  """The directory's preprocessor_config.json: `resizing` (the family's
  processor and how it sizes images), then [0, 1] pixels normalised by
  `normalization`, the input the params were trained on."""
  paths.write_atomically(paths.join(directory, HF_PREPROCESSOR), json.dumps({
      **resizing, "do_resize": True, "do_rescale": True,
      "rescale_factor": 1 / 255, "do_normalize": True,
      "image_mean": list(normalization.mean),
      "image_std": list(normalization.std), "do_convert_rgb": True},
                                                                    indent=2))
