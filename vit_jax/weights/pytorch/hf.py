"""Hugging Face transformers directories: `config.json` and
`model.safetensors`, or shards listed in `model.safetensors.index.json`.

Read: a `ViTModel` (its pooler is the pre-logits layer) or a
`ViTForImageClassification`, a DeiT, a SigLIP or SigLIP 2 vision tower
(`SiglipVisionModel`, `Siglip2VisionModel`, or the image tower of a
two-tower `SiglipModel`), a DINOv2 (`Dinov2Model`,
`Dinov2WithRegistersModel`; no classification head) or a DINOv3
(`DINOv3ViTModel`), or the encoder of a masked autoencoder
(`ViTMAEForPreTraining`, its decoder left out; `ViTMAEModel`; mae.py reads
both halves). The architecture, the function (LayerNorm epsilon, GELU)
and the class names come from `config.json`.

Written: a ViTForImageClassification, a Siglip2VisionModel (a SigLIP-style
tower), a DINOv3ViTModel (a model with 2-D RoPE) or a Dinov2Model (with
registers: Dinov2WithRegistersModel; a self-distilled backbone).
"""

import dataclasses
import json
import re

import numpy as np

from vit_jax import errors, models, paths
from vit_jax.weights.pytorch import eva, files, layouts

HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
HF_CONFIG = "config.json"
# An HF directory's image processor, where save_pretrained of a processor
# wrote one.
HF_PREPROCESSOR = "preprocessor_config.json"
# transformers' activation names -> our gelu. "gelu" is torch's exact GELU;
# the other two are the tanh approximation the release computes.
HF_GELU = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def is_hf_dir(path):
  """Whether `path` is a directory of HF weights (a workdir of ours also
  has a config.json, but never these)."""
  directory = paths.path(path)
  return directory.is_dir() and any(
      (directory / name).exists()
      for name in (HF_WEIGHTS, HF_INDEX, "pytorch_model.bin"))


# The model types read, as config.json names them: (the layout's family,
# transformers' LayerNorm epsilon and activation where the config is
# silent). A two-tower SigLIP's image tower has its own `vision_config`.
HF_FAMILIES = {
    "vit": ("vit", 1e-12, "gelu"),
    "vit_mae": ("vit", 1e-12, "gelu"),  # Its encoder (mae.py: the whole).
    "deit": ("deit", 1e-12, "gelu"),
    "siglip_vision_model": ("siglip", 1e-6, "gelu_pytorch_tanh"),
    "siglip": ("siglip", 1e-6, "gelu_pytorch_tanh"),
    "siglip2_vision_model": ("siglip2", 1e-6, "gelu_pytorch_tanh"),
    "siglip2": ("siglip2", 1e-6, "gelu_pytorch_tanh"),
    "dinov2": ("dinov2", 1e-6, "gelu"),
    "dinov2_with_registers": ("dinov2", 1e-6, "gelu"),
    "dinov3_vit": ("dinov3", 1e-5, "gelu"),
}
# Each family's input where its directory has no HF_PREPROCESSOR: its
# image processor's default in transformers.
HF_NORMALIZATION = {"vit": files.HALF, "deit": files.IMAGENET,
                    "siglip": files.HALF, "siglip2": files.HALF,
                    "dinov2": files.IMAGENET, "dinov3": files.IMAGENET}
# DINOv3's config says which of its projections have a bias (a missing
# one computes as a zero bias), and the period of its rotary embedding.
DINOV3_BIASES = {"query_bias": ("attention.q_proj",),
                 "key_bias": ("attention.k_proj",),
                 "value_bias": ("attention.v_proj",),
                 "proj_bias": ("attention.o_proj",),
                 "mlp_bias": ("mlp.up_proj", "mlp.down_proj",
                              "mlp.gate_proj")}
DINOV3_DEFAULT_BIASES = {"key_bias": False}
TWO_TOWERS = ("siglip", "siglip2")


@dataclasses.dataclass(frozen=True)
class _HFModel:
  family: str  # a key of HF_FAMILIES' first column
  config: dict  # the image model's config (a two-tower's vision_config)
  function: dict


def _hf_model(directory):
  config = files.read_json(paths.join(directory, HF_CONFIG))
  model_type = config.get("model_type")
  if model_type not in HF_FAMILIES:
    raise errors.InputError(
        f"{directory}: model_type {model_type!r}; vit_jax reads HF "
        f"{sorted(HF_FAMILIES)}")
  family, eps, act = HF_FAMILIES[model_type]
  if model_type in TWO_TOWERS:
    config = config.get("vision_config", {})
  act = config.get("hidden_act", act)
  gated = bool(config.get("use_gated_mlp"))  # DINOv3's SwiGLU MLP
  if gated and act != "silu":
    raise errors.InputError(f"{directory}: a gated MLP of hidden_act "
                            f"{act!r}; vit_jax's (mlp 'swiglu') is SiLU's")
  if not gated and act not in HF_GELU:
    raise errors.InputError(f"{directory}: hidden_act {act!r}; vit_jax "
                            f"computes {sorted(HF_GELU)}")
  if config.get("num_channels", 3) != 3:
    raise errors.InputError(f"{directory}: {config['num_channels']} input "
                            "channels; vit_jax's models take RGB")
  if family == "siglip2" and not files.is_square(
      config.get("num_patches", 256)):
    raise errors.InputError(
        f"{directory}: a SigLIP 2 tower of {config['num_patches']} "
        "position embeddings, no square grid: SigLIP 2 keeps its position "
        "table as a square that it resizes to each image's grid")
  function = {**models.FUNCTION_OPTIONS,
              "layer_norm_epsilon": float(config.get("layer_norm_eps", eps)),
              "gelu": HF_GELU.get(act, "exact"), "final_norm": "tokens"}
  if family == "dinov3":
    function.update(rope="axial",
                    rope_theta=float(config.get("rope_theta", 100.0)))
  return _HFModel(family, config, function)


def read_hf(directory):
  """The ViT in an HF transformers directory: a ViT, a DeiT (with its
  distillation head: a model with a distillation token; without: the
  token read as a register), a SigLIP or SigLIP 2 vision tower (alone or
  a two-tower model's), a DINOv2, with or without registers, or a
  DINOv3."""
  model, tensors = read_tensors(directory)
  config = model.config
  if config.get("model_type") == "vit_mae":  # The encoder alone.
    tensors = {k: v for k, v in tensors.items() if not k.startswith(
        "decoder.")}
  if model.family in ("vit", "deit"):
    prefix = f"{model.family}."
    if not any(k.startswith(prefix) for k in tensors):
      prefix = ""
    layout = ("hf5" if any(k.startswith(prefix + "layers.") for k in tensors)
              else "hf")
    if model.family == "deit":
      tensors = _deit_heads(tensors)
  elif model.family in ("dinov2", "dinov3"):
    prefix, layout = "", model.family
    _refuse_dinov2_classifier(tensors, directory)
    if config.get("use_swiglu_ffn"):  # DINOv2-g's MLP
      layout, tensors = "dinov2_swiglu", swiglu_unfused(tensors)
    # The masked-image-modelling token of DINO's pre-training.
    tensors.pop("embeddings.mask_token", None)
  else:  # SigLIP: the image tower, alone or beside a text tower.
    layout = model.family
    prefix = ("vision_model." if any(k.startswith("vision_model.")
                                     for k in tensors) else "")
    tensors = {k: v for k, v in tensors.items()
               if not k.startswith("text_model.")
               and k not in ("logit_scale", "logit_bias")}
  if f"{prefix}pooler.dense.weight" in tensors and config.get(
      "pooler_act", "tanh") != "tanh":
    raise errors.InputError(f"{directory}: pooler_act "
                            f"{config['pooler_act']!r}; the pre-logits "
                            "layer is tanh")
  heads = config.get("num_attention_heads", 12)
  if not config.get("qkv_bias", True):  # Zero biases compute the same.
    for key in layouts.qkv_weights(layout, layouts.num_layers_of(
        tensors, layout, prefix), prefix):
      if key in tensors:
        tensors[key[:-len("weight")] + "bias"] = np.zeros(
            tensors[key].shape[0], tensors[key].dtype)
  if model.family == "dinov3":
    _add_zero_biases(tensors, config)
  flat = layouts.to_release(tensors, layout, heads, prefix)
  if not _hf_key_bias(model):
    flat = files.without_key_bias(flat)
  if "dist" in flat and "head_dist/kernel" not in flat:
    flat = _deit_token_as_register(flat)
  names = None
  if "head/kernel" in flat and config.get("id2label"):
    labels = config["id2label"]
    names = [labels.get(str(i), str(i)) for i in
             range(flat["head/kernel"].shape[1])]
  image_size = None
  if model.function["rope"]:  # No position table says it.
    image_size = config.get("image_size", 224)
    image_size = (image_size if isinstance(image_size, int)
                  else max(image_size))
  return files.Read(flat, model.function, names, image_size,
                    hf_normalization(directory, model.family))


def read_tensors(directory):
  """(what config.json says of the model, {name: numpy array} of every
  tensor of its weight files) of an HF directory."""
  model = _hf_model(directory)
  tensors = {}
  for path in _hf_weight_files(directory):
    tensors.update(files.read_safetensors(path))
  return model, tensors


def _deit_heads(tensors):
  """A DeiTForImageClassificationWithTeacher's class head (`cls_classifier`)
  under the name of ViT's (`classifier`), beside its distillation head."""
  return {re.sub(r"^cls_classifier\.", "classifier.", name): value
          for name, value in tensors.items()}


def _deit_token_as_register(flat):
  """Release-layout params of an HF DeiT whose distillation token no head
  reads (DeiTForImageClassification, DeiTModel): the token as a register,
  which computes the same with its row of the position embedding added to
  it (registers get none)."""
  flat = dict(flat)
  posemb = flat[models.POSEMB_KEY]
  flat[layouts.REGISTERS] = flat.pop("dist") + posemb[:, 1:2]
  flat[models.POSEMB_KEY] = np.concatenate([posemb[:, :1], posemb[:, 2:]],
                                           axis=1)
  return flat


def hf_normalization(directory, family):
  """The Normalization of an HF directory: its HF_PREPROCESSOR's, else the
  default of its family's image processor in transformers."""
  path = paths.join(directory, HF_PREPROCESSOR)
  if not paths.path(path).exists():
    return dataclasses.replace(
        HF_NORMALIZATION[family],
        said_by=f"transformers' {family} image processor's default")
  config = files.read_json(path)
  said_by = f"its {HF_PREPROCESSOR}"
  if not config.get("do_normalize", True):
    return files.Normalization((0.0,) * 3, (1.0,) * 3, said_by)
  try:
    mean, std = (tuple(float(v) for v in config[key])
                 for key in ("image_mean", "image_std"))
  except (KeyError, TypeError, ValueError) as e:
    raise errors.InputError(f"{path}: no image_mean and image_std of 3 "
                            f"numbers each ({e})") from None
  if len(mean) != 3 or len(std) != 3:
    raise errors.InputError(f"{path}: image_mean and image_std take 3 "
                            "numbers each (RGB)")
  return files.Normalization(mean, std, said_by)


def _hf_key_bias(model):
  """Whether an HF model's attention has a key bias: all but a DINOv3
  whose config says it has none (its default)."""
  return model.family != "dinov3" or bool(model.config.get(
      "key_bias", DINOV3_DEFAULT_BIASES["key_bias"]))


def _add_zero_biases(tensors, config):
  """The zero biases of the projections that a DINOv3's config says have
  none: a zero bias computes the same."""
  missing = tuple(f".{module}.weight" for flag, modules in
                  DINOV3_BIASES.items() for module in modules
                  if not config.get(flag, DINOV3_DEFAULT_BIASES.get(flag,
                                                                    True)))
  for name, weight in list(tensors.items()):
    if name.endswith(missing):
      tensors.setdefault(name[:-len("weight")] + "bias",
                         np.zeros(weight.shape[0], weight.dtype))


def _hf_weight_files(directory):
  index = paths.join(directory, HF_INDEX)
  if paths.path(index).exists():
    shards = sorted(set(
        files.read_json(index).get("weight_map", {}).values()))
    return [paths.join(directory, shard) for shard in shards]
  single = paths.join(directory, HF_WEIGHTS)
  if paths.path(single).exists():
    return [single]
  pickles = sorted(child.name for child in paths.path(directory).iterdir()
                   if child.name.endswith(files.PICKLE_SUFFIXES))
  if pickles:
    files.refuse_pickle(paths.join(directory, pickles[0]))
  raise errors.InputError(f"{directory} has {HF_CONFIG} but neither "
                          f"{HF_WEIGHTS} nor {HF_INDEX}")


def hf_options(directory):
  """The models.SOURCE_OPTIONS of an HF directory, from its config.json and
  its weights' headers (no tensor is read): what `read_hf` then gives."""
  model = _hf_model(directory)
  shapes = {}
  for path in _hf_weight_files(directory):
    shapes.update({name: shape
                   for name, shape in files.read_shapes(path).items()
                   if not name.startswith("text_model.")})

  def named(suffix):
    return [name for name in shapes if name.endswith(suffix)]

  if model.family in ("dinov2", "dinov3"):
    _refuse_dinov2_classifier(shapes, directory)
  registers = named("embeddings.register_tokens")
  # A DeiT's distillation token, where no head reads it, is a register.
  dist = named("embeddings.distillation_token")
  dist_head = bool(dist) and bool(named("distillation_classifier.weight"))
  # Each family but DINOv3 has a learned table; DINOv3 none but RoPE.
  return {**model.function, "posemb": "none" if model.function["rope"]
          else "learn",
          "classifier": ("token" if named("embeddings.cls_token") else
                         "map" if named("head.probe") else "gap"),
          "num_registers": (shapes[registers[0]][1] if registers else
                            int(bool(dist) and not dist_head)),
          "distill_token": dist_head,
          "layer_scale": 1.0 if named(".layer_scale1.lambda1") else None,
          "qk_norm": False, "key_bias": _hf_key_bias(model),
          "mlp": "swiglu" if (model.config.get("use_gated_mlp") or
                              model.config.get("use_swiglu_ffn")) else "gelu"}


# DINOv2's SwiGLU MLP in the hub's files: the gate and up projections
# fused into one Linear, the gate's rows first (as transformers 5 and
# dinov2's SwiGLUFFNFused split it); transformers 5 names them apart.
SWIGLU_FUSED = "mlp.weights_in."
SWIGLU_PARTS = ("mlp.gate_proj.", "mlp.up_proj.")
SWIGLU_OUT = ("mlp.weights_out.", "mlp.down_proj.")


def swiglu_unfused(tensors):
  """`tensors` (a DINOv2's with use_swiglu_ffn) in transformers 5's names:
  each fused `mlp.weights_in` split into its gate and up projections."""
  out = {}
  for name, value in tensors.items():
    if SWIGLU_FUSED in name:
      for part, half in zip(SWIGLU_PARTS, np.split(value, 2)):
        out[name.replace(SWIGLU_FUSED, part)] = half
    else:
      out[name.replace(*SWIGLU_OUT)] = value
  return out


def swiglu_fused(tensors):
  """swiglu_unfused's inverse: the hub's names, which transformers 4 and 5
  both load."""
  out = {name.replace(SWIGLU_OUT[1], SWIGLU_OUT[0]): value
         for name, value in tensors.items()
         if SWIGLU_PARTS[0] not in name and SWIGLU_PARTS[1] not in name}
  for name in tensors:
    if SWIGLU_PARTS[0] in name:
      out[name.replace(SWIGLU_PARTS[0], SWIGLU_FUSED)] = np.concatenate(
          [tensors[name], tensors[name.replace(*SWIGLU_PARTS)]])
  return out


def dinov2_mlp_ratio(width, mlp_dim):
  """The whole mlp_ratio whose SwiGLU hidden width (two thirds of ratio x
  width, rounded up to a multiple of 8, as transformers' Dinov2SwiGLUFFN
  and dinov2's SwiGLUFFNFused size it) is `mlp_dim`, or None."""
  for ratio in range(1, 17):
    if (int(width * ratio * 2 / 3) + 7) // 8 * 8 == mlp_dim:
      return ratio
  return None


def _refuse_dinov2_classifier(names, directory):
  if "classifier.weight" in names or any(k.startswith("dinov2.")
                                         for k in names):
    raise errors.InputError(
        f"{directory} is a Dinov2ForImageClassification, whose classifier "
        "reads the class token beside the patch tokens' mean; vit_jax "
        "reads its backbone: save_pretrained its `.dinov2` (a Dinov2Model) "
        "and fine-tune from that")


# transformers' hidden_act of each of our GELUs.
HF_ACT = {"exact": "gelu", "tanh": "gelu_pytorch_tanh"}


def write_hf(directory, flat, function, class_names, what):
  """An HF transformers ViTForImageClassification directory."""
  files.check_writable(flat, function, "hf", what)
  sizes = files.sizes(flat)
  hidden_act = HF_ACT[function["gelu"]]
  names = class_names or [f"LABEL_{i}" for i in range(sizes["num_classes"])]
  config = {
      "architectures": ["ViTForImageClassification"], "model_type": "vit",
      "hidden_size": sizes["hidden_size"],
      "num_hidden_layers": sizes["num_layers"],
      "num_attention_heads": sizes["num_heads"],
      "intermediate_size": sizes["mlp_dim"], "hidden_act": hidden_act,
      "layer_norm_eps": function["layer_norm_epsilon"],
      "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
      "initializer_range": 0.02, "image_size": sizes["image_size"],
      "patch_size": sizes["patch_size"], "num_channels": 3, "qkv_bias": True,
      "encoder_stride": sizes["patch_size"],
      "id2label": {str(i): name for i, name in enumerate(names)},
      "label2id": {name: i for i, name in enumerate(names)},
  }
  # Each file replaces its old one whole (the folder is made for them).
  files.write_safetensors(layouts.from_release(flat, "hf", prefix="vit."),
                          paths.join(directory, HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, HF_CONFIG),
                         json.dumps(config, indent=2))


def is_siglip_tower(flat):
  """Whether release-layout params are a SigLIP-style image tower: no
  classification head, no class token, attention pooling."""
  return ("head/kernel" not in flat and "cls" not in flat
          and layouts.MAP_PROBE in flat)


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
DINO_HEADS = ("dino_head/", "ibot_head/")
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
    tensors = swiglu_fused(layouts.from_release(flat, "dinov2_swiglu"))
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


def write_siglip2(directory, flat, function, what):
  """An HF transformers Siglip2VisionModel directory of a SigLIP-style
  tower (`is_siglip_tower`): the layout SigLIP 2's NaFlex towers come in,
  which transformers computes at any grid, its square position table
  resized per image as ours is."""
  cannot = [part for key, part in (
      ("conv_root/kernel", "a hybrid's ResNet stem"),
      ("pre_logits/kernel", "a pre-logits layer"),
      ("fc_norm/scale", "final_norm 'pooled'"),
      (layouts.BLOCK.format(0) + "MlpBlock_3/Dense_gate/kernel",
       "a SwiGLU MLP (mlp 'swiglu')"),
      (layouts.REGISTERS, "register tokens"),
      (layouts.BLOCK.format(0) + "ls1", "layer scale"),
      (layouts.BLOCK.format(0) + layouts.ATTENTION
       + "/query_norm/scale", "query/key norms")) if key in flat]
  cannot += files.function_cannot(function)
  if models.POSEMB_KEY not in flat:
    cannot.append("a position embedding other than 'learn'")
  files.refuse(what, "as a Siglip2VisionModel", cannot)
  sizes = files.sizes(flat)
  config = {
      "architectures": ["Siglip2VisionModel"],
      "model_type": "siglip2_vision_model",
      "hidden_size": sizes["hidden_size"],
      "intermediate_size": sizes["mlp_dim"],
      "num_hidden_layers": sizes["num_layers"],
      "num_attention_heads": sizes["num_heads"], "num_channels": 3,
      "num_patches": flat[models.POSEMB_KEY].shape[1],
      "patch_size": sizes["patch_size"],
      "hidden_act": HF_ACT[function["gelu"]],
      "layer_norm_eps": function["layer_norm_epsilon"],
      "attention_dropout": 0.0, "vision_use_head": True,
  }
  tensors = layouts.from_release(flat, "siglip2", prefix="vision_model.")
  # torch's nn.MultiheadAttention names its fused projection so.
  tensors = {name.replace("in_proj.", "in_proj_"): value
             for name, value in tensors.items()}
  files.write_safetensors(tensors, paths.join(directory, HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, HF_CONFIG),
                         json.dumps(config, indent=2))

