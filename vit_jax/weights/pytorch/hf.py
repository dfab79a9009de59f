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

Written: a ViTForImageClassification or a Siglip2VisionModel (a
SigLIP-style tower); the DINO families (DINOv3ViTModel, Dinov2Model) are
hf_dino.py's.
"""

import dataclasses
import json
import re

import numpy as np

from vit_jax import errors, models, paths
from vit_jax.weights.pytorch import files, layouts

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
      layout, tensors = "dinov2_swiglu", layouts.swiglu_unfused(tensors)
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


def refuse_unwritable_siglip(flat, function, what, target):
  """An InputError naming what of a SigLIP-style tower (`flat`,
  `function`) transformers' SigLIP towers do not compute, if anything:
  a hybrid stem, registers, layer scale, ..."""
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
  files.refuse(what, target, cannot)


def write_siglip2(directory, flat, function, what):
  """An HF transformers Siglip2VisionModel directory of a SigLIP-style
  tower (`is_siglip_tower`): the layout SigLIP 2's NaFlex towers come in,
  which transformers computes at any grid, its square position table
  resized per image as ours is."""
  refuse_unwritable_siglip(flat, function, what, "as a Siglip2VisionModel")
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

