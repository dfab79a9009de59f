"""ViT checkpoints of the PyTorch world, read and written as numpy.

- A Hugging Face transformers directory: `config.json` and
  `model.safetensors`, or shards listed in `model.safetensors.index.json`;
  a `ViTModel` (its pooler is the pre-logits layer) or a
  `ViTForImageClassification`. The architecture, the function (LayerNorm
  epsilon, GELU) and the class names come from `config.json`.
- A SigLIP or SigLIP 2 vision tower (`SiglipVisionModel`,
  `Siglip2VisionModel`, or the image tower of a two-tower `SiglipModel`),
  or a DINOv2 (`Dinov2Model`, `Dinov2WithRegistersModel`) directory, in
  the same form; a DINOv2 has no classification head.
- A timm `VisionTransformer` state dict in one `.safetensors` file, with
  timm's register tokens, layer scale, query/key norms and attention
  pooling where it has them. Its sizes come from the shapes; its head
  count from the hidden size of a paper variant (or the caller); its
  function is timm's (epsilon 1e-6, exact GELU, `fc_norm` for
  average-pool models).

Files are read through safetensors' numpy API. PyTorch pickles (`.bin`,
`.pt`, `.pth`) are refused: unpickling runs whatever code the file holds.
torch_layouts.py holds the key names and array conversions. Directories
and files may be local or URLs (`gs://`), read and written through
vit_jax/paths.py; each file written replaces its old one whole.
"""

import dataclasses
import json
import os
import re

import numpy as np
import safetensors
import safetensors.numpy

from vit_jax import errors, models, paths
from vit_jax.weights import torch_layouts

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
HF_CONFIG = "config.json"
# transformers' activation names -> our gelu. "gelu" is torch's exact GELU;
# the other two are the tanh approximation the release computes.
HF_GELU = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
TIMM_FUNCTION = {"layer_norm_epsilon": 1e-6, "gelu": "exact"}
# What transformers 5 wants in a safetensors header to load the file.
METADATA = {"format": "pt"}


@dataclasses.dataclass(frozen=True)
class Setters:
  """What a user gives a model's input mean and std by, for the messages
  that name them: a tool's flags, or a run's config keys (a teacher's,
  training/distill.py)."""
  mean: str
  std: str
  how: str  # how to change it: "give those flags"


# The flags of the tools that run a source (cli/shared_flags.py).
FLAGS = Setters("--input_mean", "--input_std", "give those flags")


@dataclasses.dataclass(frozen=True)
class Normalization:
  """The input a model was trained on: (pixels / 255 - mean) / std per RGB
  channel; `said_by`: what says so, None where it is assumed (the file
  saying nothing)."""
  mean: tuple
  std: tuple
  said_by: str | None = None

  def named(self, by=FLAGS):
    """The values, as `by` (Setters) gives them."""
    return (f"{by.mean}={','.join(map(str, self.mean))} "
            f"{by.std}={','.join(map(str, self.std))}")


# vit_jax's own input, [-1, 1] (the released checkpoints', HF ViT's and
# SigLIP's processors', timm's VisionTransformer's default), and ImageNet's
# (DINOv2's and DINOv3's).
HALF = Normalization((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
IMAGENET = Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# An HF directory's image processor, where save_pretrained of a processor
# wrote one.
HF_PREPROCESSOR = "preprocessor_config.json"


@dataclasses.dataclass(frozen=True)
class Read:
  """A checkpoint read into the release layout."""
  flat: dict  # {'a/b/c': numpy array}
  function: dict  # models.FUNCTION_OPTIONS values it computes with
  class_names: list | None = None
  # The side it was made for, where no position table says it (a config's).
  image_size: int | None = None
  normalization: Normalization = HALF


def refuse_pickle(path):
  """InputError for a PyTorch pickle, saying how to convert it."""
  raise errors.InputError(
      f"{path} is a PyTorch pickle, which vit_jax never loads (unpickling "
      "runs the code a file holds); convert it once to safetensors where "
      "you trust it.\n"
      "An HF ViT: python -c \"import transformers; transformers."
      "ViTForImageClassification.from_pretrained('DIR').save_pretrained("
      "'NEW_DIR')\" (ViTModel for one without a head), then give NEW_DIR.\n"
      "A timm or other state dict: python -c \"import torch, "
      "safetensors.torch; safetensors.torch.save_file(torch.load('FILE', "
      "map_location='cpu', weights_only=True), 'FILE.safetensors')\"")


def is_hf_dir(path):
  """Whether `path` is a directory of HF weights (a workdir of ours also
  has a config.json, but never these)."""
  directory = paths.path(path)
  return directory.is_dir() and any(
      (directory / name).exists()
      for name in (HF_WEIGHTS, HF_INDEX, "pytorch_model.bin"))


def read_safetensors(path):
  """{name: numpy array} of a .safetensors file, local or a URL."""
  if not paths.path(path).exists():
    raise errors.InputError(f"{path} does not exist")
  try:
    # safetensors opens local files only: a URL's is copied to a local
    # temporary file (streamed, never whole in memory) and mapped from there.
    with paths.local_copy(path) as local:
      return safetensors.numpy.load_file(local)
  except (safetensors.SafetensorError, OSError) as e:
    raise errors.InputError(f"{path} is not a .safetensors file: {e}") from e


# safetensors' own bound on a header: 100 MB.
MAX_HEADER_BYTES = 100_000_000


def read_shapes(path):
  """{name: shape} of a .safetensors file, local or a URL, from its header
  alone (8 bytes of length, then JSON): no tensor is read."""
  file = paths.path(path)
  if not file.exists():
    raise errors.InputError(f"{path} does not exist")
  with file.open("rb") as f:
    length = int.from_bytes(f.read(8), "little")
    try:
      if not 0 < length <= MAX_HEADER_BYTES:
        raise ValueError(f"a header of {length} bytes")
      header = json.loads(f.read(length))
      return {name: tuple(entry["shape"]) for name, entry in header.items()
              if name != "__metadata__"}
    except (ValueError, TypeError, KeyError) as e:
      raise errors.InputError(
          f"{path} is not a .safetensors file: {e}") from e


def write_safetensors(tensors, path):
  # Written under a temporary name, then put in place whole: a failed
  # write leaves the old file, and never half a new one.
  with paths.writing(path) as local:
    try:
      safetensors.numpy.save_file(tensors, local, metadata=METADATA)
    except safetensors.SafetensorError as e:
      # An I/O failure (a full disk) comes as safetensors' own error, which
      # gives the OS's only in its message: "... (os error 28)".
      number = re.search(r"\(os error (\d+)\)", str(e))
      if number is None:
        raise
      raise OSError(int(number.group(1)), os.strerror(int(number.group(1))),
                    local) from e


def heads_for_width(hidden_size):
  """The head count of the paper's variant of this width (Ti..H)."""
  for sizes in models.VARIANTS.values():
    if sizes["hidden_size"] == hidden_size:
      return sizes["num_heads"]
  raise errors.InputError(
      f"hidden size {hidden_size} is none of the paper's variants, so its "
      "head count is unknown: give it (--num_heads)")


def _read_json(path):
  file = paths.path(path)
  # Asked first: a missing object is not a FileNotFoundError on every
  # file system epath speaks.
  if not file.exists():
    raise errors.InputError(f"{path} does not exist")
  try:
    return json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise errors.InputError(f"{path} is not JSON: {e}") from e


# The model types read, as config.json names them: (the layout's family,
# transformers' LayerNorm epsilon and activation where the config is
# silent). A two-tower SigLIP's image tower has its own `vision_config`.
HF_FAMILIES = {
    "vit": ("vit", 1e-12, "gelu"),
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
HF_NORMALIZATION = {"vit": HALF, "deit": IMAGENET, "siglip": HALF,
                    "siglip2": HALF, "dinov2": IMAGENET, "dinov3": IMAGENET}
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
  config = _read_json(paths.join(directory, HF_CONFIG))
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
  if config.get("use_swiglu_ffn"):
    raise errors.InputError(
        f"{directory}: a DINOv2 with a SwiGLU MLP (use_swiglu_ffn, "
        "DINOv2-g), whose fused weights vit_jax does not read")
  if family == "siglip2" and not _is_square(config.get("num_patches", 256)):
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
  model = _hf_model(directory)
  config = model.config
  tensors = {}
  for path in _hf_weight_files(directory):
    tensors.update(read_safetensors(path))
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
    for key in torch_layouts.qkv_weights(layout, torch_layouts.num_layers_of(
        tensors, layout, prefix), prefix):
      if key in tensors:
        tensors[key[:-len("weight")] + "bias"] = np.zeros(
            tensors[key].shape[0], tensors[key].dtype)
  if model.family == "dinov3":
    _add_zero_biases(tensors, config)
  flat = torch_layouts.to_release(tensors, layout, heads, prefix)
  if not _hf_key_bias(model):
    flat = _without_key_bias(flat)
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
  return Read(flat, model.function, names, image_size,
              hf_normalization(directory, model.family))


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
  flat[torch_layouts.REGISTERS] = flat.pop("dist") + posemb[:, 1:2]
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
  config = _read_json(path)
  said_by = f"its {HF_PREPROCESSOR}"
  if not config.get("do_normalize", True):
    return Normalization((0.0,) * 3, (1.0,) * 3, said_by)
  try:
    mean, std = (tuple(float(v) for v in config[key])
                 for key in ("image_mean", "image_std"))
  except (KeyError, TypeError, ValueError) as e:
    raise errors.InputError(f"{path}: no image_mean and image_std of 3 "
                            f"numbers each ({e})") from None
  if len(mean) != 3 or len(std) != 3:
    raise errors.InputError(f"{path}: image_mean and image_std take 3 "
                            "numbers each (RGB)")
  return Normalization(mean, std, said_by)


def _hf_key_bias(model):
  """Whether an HF model's attention has a key bias: all but a DINOv3
  whose config says it has none (its default)."""
  return model.family != "dinov3" or bool(model.config.get(
      "key_bias", DINOV3_DEFAULT_BIASES["key_bias"]))


def _without_key_bias(flat):
  """Release-layout `flat` without the attention's key biases, which
  the readers filled with zeros where the source has none: such a model
  (model.key_bias off) keeps none, so that fine-tuning trains none."""
  return {key: value for key, value in flat.items()
          if not (key.startswith("Transformer/encoderblock_")
                  and key.endswith(f"/{torch_layouts.ATTENTION}/key/bias"))}


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
    shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
    return [paths.join(directory, shard) for shard in shards]
  single = paths.join(directory, HF_WEIGHTS)
  if paths.path(single).exists():
    return [single]
  pickles = sorted(child.name for child in paths.path(directory).iterdir()
                   if child.name.endswith(PICKLE_SUFFIXES))
  if pickles:
    refuse_pickle(paths.join(directory, pickles[0]))
  raise errors.InputError(f"{directory} has {HF_CONFIG} but neither "
                          f"{HF_WEIGHTS} nor {HF_INDEX}")


def hf_options(directory):
  """The models.SOURCE_OPTIONS of an HF directory, from its config.json and
  its weights' headers (no tensor is read): what `read_hf` then gives."""
  model = _hf_model(directory)
  shapes = {}
  for path in _hf_weight_files(directory):
    shapes.update({name: shape for name, shape in read_shapes(path).items()
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
          "mlp": "swiglu" if model.config.get("use_gated_mlp") else "gelu"}


def _refuse_dinov2_classifier(names, directory):
  if "classifier.weight" in names or any(k.startswith("dinov2.")
                                         for k in names):
    raise errors.InputError(
        f"{directory} is a Dinov2ForImageClassification, whose classifier "
        "reads the class token beside the patch tokens' mean; vit_jax "
        "reads its backbone: save_pretrained its `.dinov2` (a Dinov2Model) "
        "and fine-tune from that")


def timm_options(path):
  """The models.SOURCE_OPTIONS of a timm .safetensors file, from its header
  (no tensor is read): what `read_timm` then gives. A class token that the
  model does not pool is one more register (`_timm_prefix_tokens`)."""
  shapes = read_shapes(path)
  _check_timm(shapes, path)
  eva = _eva_kind(shapes, path)
  pooled = _pools_class_token(shapes, eva)
  prefix_tokens = ("cls_token" in shapes) + (
      shapes["reg_token"][1] if "reg_token" in shapes else 0)
  return {**_timm_function(shapes, eva),
          "posemb": "learn" if "pos_embed" in shapes else "none",
          "classifier": ("token" if pooled else
                         "map" if "attn_pool.latent" in shapes else "gap"),
          "num_registers": prefix_tokens - pooled,
          "distill_token": "dist_token" in shapes,
          "layer_scale": 1.0 if any(
              key in shapes for key in ("blocks.0.ls1.gamma",
                                        "blocks.0.gamma_1")) else None,
          "qk_norm": "blocks.0.attn.q_norm.weight" in shapes,
          # timm's DINOv3 ports have none (a zero buffer in its place).
          "key_bias": eva != "dinov3",
          "mlp": "swiglu" if "blocks.0.mlp.fc1_g.weight" in shapes else
                 "gelu"}


def _check_timm(names, path):
  """InputError unless the tensor `names` are a timm VisionTransformer's."""
  if any(k.startswith(("vit.", "embeddings.", "vision_model."))
         for k in names):
    raise errors.InputError(
        f"{path} holds an HF transformers model: give the directory it lies "
        f"in, with its {HF_CONFIG}")
  if "patch_embed.proj.weight" not in names:
    raise errors.InputError(
        f"{path} is no timm VisionTransformer (no patch_embed.proj.weight); "
        f"first keys: {sorted(names)[:6]}")


def _timm_function(keys, eva=None):
  """timm's function, with the pooled features normalised where the file
  has an fc_norm; an Eva's (`_eva_kind`) with its rotary embedding."""
  function = {**models.FUNCTION_OPTIONS, **TIMM_FUNCTION,
              "final_norm": "pooled" if "fc_norm.weight" in keys else
              "tokens"}
  function.update(EVA_FUNCTIONS.get(eva, {}))
  return function


def _pools_class_token(keys, eva):
  """Whether timm's model pools its class token: a VisionTransformer with
  neither fc_norm nor attention pooling does, and so do timm's RoPE ViTs;
  its DINOv3 ports average the patch tokens (global_pool "avg", their
  default in timm)."""
  return "cls_token" in keys and eva != "dinov3" and not any(
      key in keys for key in ("fc_norm.weight", "attn_pool.latent"))


# timm's Eva class (timm.models.eva) holds two families that vit_jax reads,
# told apart by their tensors (`_eva_kind`):
# - "dinov3", its DINOv3 ports (`vit_*_patch16_dinov3*`): no position table
#   but DINOv3's axial rotary embedding at period 100, four registers
#   beside the class token, LayerNorm at epsilon 1e-5, the query and value
#   biases (`q_bias`, `v_bias`; the key's is a zero buffer) or none, and a
#   SwiGLU MLP in the largest (`fc1_g`, `fc1_x`, `fc2`);
# - its RoPE ViTs (`vit_*_patch16_rope_224`, `..._rope_ape_224` with a
#   position table): "index", timm's "cat" rotary embedding over the
#   patches' indices at period 100, and "mixed" (`..._rope_mixed_*`), its
#   learned frequencies (`rope.freqs`, [2, depth, heads, Dh / 2]); a class
#   token, which they pool, no registers, one fused qkv with its bias.
# All have layer scales `gamma_1`/`gamma_2` and heads 64 wide, but the
# DINOv3 7B's (32 heads of 128). The RoPE ViTs rotate interleaved channel
# pairs (2j, 2j + 1), "index" the column's planes before the row's;
# vit_jax pairs channel j with j + Dh / 2, the row's first, so their
# query and key channels are permuted within each head (`_rope_channels`),
# which leaves every q.k as it was. EVA-02 (timm's "cat" RoPE with a
# SwiGLU MLP, at its own period) is refused.
EVA_MARKS = ("blocks.0.gamma_1", "blocks.0.attn.q_bias", "rope.freqs",
             "blocks.0.mlp.fc1_g.weight")
EVA_FUNCTIONS = {
    "dinov3": {"rope": "axial", "rope_theta": 100.0,
               "layer_norm_epsilon": 1e-5},
    "index": {"rope": "index", "rope_theta": 100.0},
    "mixed": {"rope": "mixed", "rope_theta": 10.0},  # its initial periods
}
EVA_HEAD_DIM = 64
EVA_HEADS = {4096: 32}  # by width, where the heads are not 64 wide
# timm's input size of its DINOv3 ports (their pretrained_cfg); its RoPE
# ViTs' is 224.
EVA_IMAGE_SIZES = {"dinov3": 256, "index": 224, "mixed": 224}


def _eva_kind(names, path):
  """None for a timm VisionTransformer, else the kind of timm Eva the tensor
  `names` are (EVA_FUNCTIONS' keys); InputError for an Eva that vit_jax
  does not compute, naming why."""
  if not any(mark in names for mark in EVA_MARKS):
    return None
  if "rope.freqs" in names:
    kind = "mixed"
  elif "reg_token" not in names:
    kind = "index"
  elif "pos_embed" not in names:
    kind = "dinov3"
  else:
    raise errors.InputError(
        f"{path} is a timm Eva with registers and a position table, which "
        "vit_jax does not read; of timm's Evas it reads the DINOv3 ports "
        "(vit_*_patch16_dinov3*) and the RoPE ViTs (vit_*_rope_*)")
  if kind != "dinov3" and "blocks.0.mlp.fc1_g.weight" in names:
    raise errors.InputError(
        f"{path} is a timm Eva with a SwiGLU MLP and timm's own rotary "
        "embedding (EVA-02), which vit_jax does not read; of timm's Evas it "
        "reads the DINOv3 ports (vit_*_patch16_dinov3*) and the RoPE ViTs "
        "(vit_*_rope_*)")
  return kind


def _rope_channels(head_dim, kind):
  """[head_dim] indices: vit_jax's channel c of a head is timm's channel
  `perm[c]` in a RoPE ViT of `kind` ("index" or "mixed"; module comment
  above)."""
  half = head_dim // 2
  planes = np.arange(half)
  if kind == "index":  # timm's column planes come first, vit_jax's row's.
    planes = (planes + head_dim // 4) % half
  return np.concatenate([2 * planes, 2 * planes + 1])


def _permute_queries_and_keys(tensors, num_heads, perm):
  """`tensors` (timm names) with the query and key channels of each head
  of every fused qkv (and q/k norm) taken in the order `perm`."""
  tensors = dict(tensors)
  for name in [n for n in tensors if n.endswith(".attn.qkv.weight")]:
    attn = name[:-len("qkv.weight")]
    for leaf in ("weight", "bias"):
      value = tensors[attn + "qkv." + leaf]
      width = value.shape[0] // 3
      parts = value.reshape(3, num_heads, width // num_heads,
                            *value.shape[1:])
      parts = np.concatenate([parts[:2, :, perm], parts[2:]])
      tensors[attn + "qkv." + leaf] = parts.reshape(value.shape)
    for norm in ("q_norm", "k_norm"):
      for leaf in ("weight", "bias"):
        key = f"{attn}{norm}.{leaf}"
        if key in tensors:
          tensors[key] = tensors[key][perm]
  return tensors


def _from_eva(tensors, kind, num_heads):
  """An Eva's `tensors` of `kind` in timm VisionTransformer's names: its
  layer scales as ls1/ls2.gamma, one fused qkv bias, zero for the key (and
  for all three where the Eva has none, which computes the same), a
  SwiGLU's `fc1_x` as `fc1` (its gate `fc1_g` is the timm layout's); a
  RoPE ViT's query and key channels in vit_jax's order, and its "mixed"
  frequencies one block's each (`blocks.{i}.attn.rope_freqs`)."""
  tensors = dict(tensors)
  for name in [n for n in tensors if n.endswith(".attn.qkv.weight")]:
    attn = name[:-len("qkv.weight")]
    width = tensors[name].shape[0] // 3
    zeros = np.zeros(width, tensors[name].dtype)
    if attn + "qkv.bias" not in tensors:
      tensors[attn + "qkv.bias"] = np.concatenate([
          tensors.pop(attn + "q_bias", zeros), zeros,
          tensors.pop(attn + "v_bias", zeros)])
  if kind in ("index", "mixed"):
    width = tensors["patch_embed.proj.weight"].shape[0]
    tensors = _permute_queries_and_keys(
        tensors, num_heads, _rope_channels(width // num_heads, kind))
  if "rope.freqs" in tensors:
    freqs = tensors.pop("rope.freqs")
    for i in range(freqs.shape[1]):
      tensors[f"blocks.{i}.attn.rope_freqs"] = freqs[:, i]
  return {re.sub(r"\.mlp\.fc1_x\.", ".mlp.fc1.",
                 re.sub(r"\.gamma_([12])$", r".ls\1.gamma", name)): value
          for name, value in tensors.items()}


def read_timm(path, num_heads=None):
  """The ViT of a timm state dict in a .safetensors file: a
  VisionTransformer, or an Eva of DINOv3's or a RoPE ViT (`_eva_kind`)."""
  tensors = read_safetensors(path)
  _check_timm(tensors, path)
  eva = _eva_kind(tensors, path)
  function = _timm_function(tensors, eva)
  pooled = _pools_class_token(tensors, eva)
  hidden = tensors["patch_embed.proj.weight"].shape[0]
  if eva:
    if not num_heads and hidden % EVA_HEAD_DIM:
      raise errors.InputError(
          f"{path}: a timm Eva of width {hidden}, no multiple of its "
          f"heads' width {EVA_HEAD_DIM}: give its head count (--num_heads)")
    num_heads = num_heads or EVA_HEADS.get(hidden, hidden // EVA_HEAD_DIM)
    tensors = _from_eva(tensors, eva, num_heads)
  num_heads = num_heads or heads_for_width(hidden)
  flat = torch_layouts.to_release(_timm_prefix_tokens(tensors, pooled),
                                  "timm", num_heads)
  if eva == "dinov3":
    flat = _without_key_bias(flat)
  return Read(flat, function,
              image_size=EVA_IMAGE_SIZES.get(eva),
              normalization=IMAGENET if eva else HALF)


def _timm_prefix_tokens(tensors, pooled_token):
  """`tensors` with timm's class and register tokens (its "prefix tokens")
  where vit_jax keeps them.

  timm adds the position embedding to them too unless no_embed_class;
  vit_jax's registers get none, so theirs is folded into the registers
  (a constant added to a constant). A class token that is not what the
  model pools (global_pool "avg" or "map", which read the patch tokens
  only, as timm's default pool_include_prefix=False does) is one more
  register. One it pools keeps its own row of the position embedding,
  zero under no_embed_class. DeiT's distilled models (a `dist_token`)
  keep theirs as vit_jax does: the class and distillation tokens' rows
  ahead of the patches', no registers.
  """
  if "dist_token" in tensors:
    _check_deit(tensors)
    return tensors
  tensors = dict(tensors)
  tokens = [tensors.pop(key) for key in ("cls_token", "reg_token")
            if key in tensors]
  if not tokens:
    return tensors
  prefix = np.concatenate(tokens, axis=1)
  posemb = tensors.get("pos_embed")
  prefix_pos = None  # no_embed_class: none
  if posemb is not None and not _is_square(posemb.shape[1]):
    # Rows for the prefix tokens too: the grid is the rows after them.
    width = prefix.shape[1]
    prefix_pos, tensors["pos_embed"] = posemb[:, :width], posemb[:, width:]
  if pooled_token:
    tensors["cls_token"], prefix = prefix[:, :1], prefix[:, 1:]
    if posemb is not None:
      cls_pos = (np.zeros_like(posemb[:, :1]) if prefix_pos is None
                 else prefix_pos[:, :1])
      tensors["pos_embed"] = np.concatenate([cls_pos, tensors["pos_embed"]],
                                            axis=1)
      prefix_pos = None if prefix_pos is None else prefix_pos[:, 1:]
  if prefix.shape[1]:
    tensors["reg_token"] = prefix if prefix_pos is None else (
        prefix + prefix_pos)
  return tensors


def _check_deit(tensors):
  """InputError unless a timm model with a distillation token is laid out
  as DeiT's distilled models are (VisionTransformerDistilled): no
  registers, a position table with the class and distillation tokens'
  rows first."""
  posemb = tensors.get("pos_embed")
  if ("reg_token" in tensors or "cls_token" not in tensors or posemb is None
      or not _is_square(posemb.shape[1] - 2)):
    raise errors.InputError(
        "a timm model with a dist_token that is no DeiT distilled model: "
        "vit_jax reads its class token, distillation token and a position "
        "table with their rows first, and no registers")


def _is_square(n):
  return int(round(np.sqrt(n))) ** 2 == n


def _function_cannot(function):
  """What of `function` no PyTorch layout written here computes."""
  if function["rope"]:
    return [f"2-D rotary embeddings (rope {function['rope']!r})"]
  return []


def _refuse(what, target, cannot):
  """InputError naming what of `what` cannot be written `target` ("as a
  DINOv3ViTModel", ...), where `cannot` lists anything."""
  if cannot:
    raise errors.InputError(
        f"{what} cannot be written {target}: the model has "
        f"{'; '.join(cannot)}. --format=npz writes any of vit_jax's models")


def _check_writable(flat, function, layout, what):
  """InputError unless `flat`, computing `function`, is a ViT the layout
  can hold."""
  cannot = _function_cannot(function)
  if "conv_root/kernel" in flat:
    cannot.append("a hybrid's ResNet stem")
  if models.POSEMB_KEY not in flat:
    cannot.append("a position embedding other than 'learn'")
  if torch_layouts.BLOCK.format(0) + "MlpBlock_3/Dense_gate/kernel" in flat:
    cannot.append("a SwiGLU MLP (mlp 'swiglu')")
  if "mpp_head/kernel" in flat or "head/kernel" not in flat:
    cannot.append("no classification head")
  if "pre_logits/kernel" in flat:
    cannot.append("a pre-logits layer (fine-tuned models have none)")
  if layout == "hf" and "cls" not in flat:
    cannot.append("no class token (classifier 'gap')")
  if layout == "hf" and "fc_norm/scale" in flat:
    cannot.append("final_norm 'pooled'")
  if "dist" in flat and torch_layouts.REGISTERS in flat:
    cannot.append("a distillation token beside registers")
  # The parts of today's checkpoints (docs/models.md, "Today's options"):
  # timm's VisionTransformer has them all, HF's ViT none.
  block = torch_layouts.BLOCK.format(0)
  for key, part in ((torch_layouts.MAP_PROBE, "attention pooling "
                     "(classifier 'map')"), (block + "ls1", "layer scale"),
                    (torch_layouts.REGISTERS, "register tokens"),
                    ("dist", "a distillation token"),
                    (block + torch_layouts.ATTENTION + "/query_norm/scale",
                     "query/key norms")):
    if layout == "hf" and key in flat:
      cannot.append(part + " (--format=timm writes it)")
  _refuse(what, f"for {layout}", cannot)


# transformers' hidden_act of each of our GELUs.
HF_ACT = {"exact": "gelu", "tanh": "gelu_pytorch_tanh"}


def _sizes(flat):
  """The sizes of release-layout params; image_size None where no learned
  table says it."""
  patch, _, _, hidden = flat["embedding/kernel"].shape
  image_size = None
  if models.POSEMB_KEY in flat:
    tokens = flat[models.POSEMB_KEY].shape[1] - models.posemb_prefix(flat)
    image_size = models.grid_side(tokens, models.POSEMB_KEY) * int(patch)
  query = flat[torch_layouts.BLOCK.format(0) + torch_layouts.ATTENTION +
               "/query/kernel"]
  return dict(
      patch_size=int(patch), hidden_size=int(hidden),
      num_heads=int(query.shape[1]),
      num_layers=len({k.split("/")[1] for k in flat
                      if k.startswith("Transformer/encoderblock_")}),
      mlp_dim=int(flat[torch_layouts.BLOCK.format(0) +
                       "MlpBlock_3/Dense_0/kernel"].shape[1]),
      num_classes=(int(flat["head/kernel"].shape[1]) if "head/kernel" in flat
                   else 0),
      image_size=image_size)


def write_hf(directory, flat, function, class_names, what):
  """An HF transformers ViTForImageClassification directory."""
  _check_writable(flat, function, "hf", what)
  sizes = _sizes(flat)
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
  write_safetensors(torch_layouts.from_release(flat, "hf", prefix="vit."),
                    paths.join(directory, HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, HF_CONFIG),
                         json.dumps(config, indent=2))


def is_siglip_tower(flat):
  """Whether release-layout params are a SigLIP-style image tower: no
  classification head, no class token, attention pooling."""
  return ("head/kernel" not in flat and "cls" not in flat
          and torch_layouts.MAP_PROBE in flat)


def _eva_family_cannot(flat):
  """The parts of release-layout `flat` that neither transformers'
  DINOv3ViTModel nor timm's Eva holds."""
  return [part for key, part in (
      ("conv_root/kernel", "a hybrid's ResNet stem"),
      ("dist", "a distillation token"),
      ("pre_logits/kernel", "a pre-logits layer"),
      ("fc_norm/scale", "final_norm 'pooled'"),
      (models.POSEMB_2D_KEYS[0], "a 2-D position table"),
      (torch_layouts.MAP_PROBE, "attention pooling (classifier 'map')"),
      (torch_layouts.BLOCK.format(0) + torch_layouts.ATTENTION +
       "/query_norm/scale", "query/key norms")) if key in flat]


def _dinov3_cannot(flat, function):
  """What of release-layout `flat`, computing `function`, DINOv3's layouts
  (transformers' DINOv3ViTModel, timm's DINOv3 Evas) cannot hold."""
  cannot = _eva_family_cannot(flat)
  if models.POSEMB_KEY in flat:
    cannot.append("a position table")
  if not function["rope"]:
    cannot.append("no 2-D rotary embeddings (rope 'axial')")
  elif function["rope"] != "axial":
    cannot.append(f"rope {function['rope']!r}, where DINOv3's is 'axial' "
                  "(--format=timm writes timm's RoPE ViTs)")
  return cannot


def write_dinov3(directory, flat, function, image_size, what):
  """An HF transformers DINOv3ViTModel directory of a model with 2-D RoPE
  and no position table (DINOv3's family); returns the number of classes
  of the head it leaves out (the family has no classifier), or 0. Every
  projection is written with its bias but a key's where the model has
  none (`key_bias`), and a model without layer scale gets scales of ones,
  which compute the same. A model that pools the patch tokens and has no
  class token writes its first register as the class token, as `write_eva`
  does: DINOv3ViTModel's class token and registers are the same kind of
  token (none rotated), so the patch tokens compute the same."""
  cannot = _dinov3_cannot(flat, function)
  if "cls" not in flat and torch_layouts.REGISTERS not in flat:
    cannot.append("neither a class token nor a register to write as one")
  _refuse(what, "as a DINOv3ViTModel", cannot)
  sizes = _sizes(flat)
  flat = dict(flat)
  if "cls" not in flat:
    registers = flat.pop(torch_layouts.REGISTERS)
    flat["cls"] = registers[:, :1]
    if registers.shape[1] > 1:
      flat[torch_layouts.REGISTERS] = registers[:, 1:]
  flat.pop("head/kernel", None)
  flat.pop("head/bias", None)
  width = sizes["hidden_size"]
  dtype = flat["embedding/kernel"].dtype
  for i in range(sizes["num_layers"]):
    for scale in ("ls1", "ls2"):
      flat.setdefault(torch_layouts.BLOCK.format(i) + scale,
                      np.ones(width, dtype))
  registers = flat.get(torch_layouts.REGISTERS)
  architecture = models.architecture_of(flat)
  gated = architecture["mlp"] == "swiglu"
  tensors = torch_layouts.from_release(flat, "dinov3")
  if not architecture["key_bias"]:  # from_release's zeros.
    for i in range(sizes["num_layers"]):
      del tensors[f"layer.{i}.attention.k_proj.bias"]
  # The masked-image-modelling token, which inference does not read.
  tensors["embeddings.mask_token"] = np.zeros((1, 1, width), dtype)
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
  write_safetensors(tensors, paths.join(directory, HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, HF_CONFIG),
                         json.dumps(config, indent=2))
  return sizes["num_classes"]


def write_siglip2(directory, flat, function, what):
  """An HF transformers Siglip2VisionModel directory of a SigLIP-style
  tower (`is_siglip_tower`): the layout SigLIP 2's NaFlex towers come in,
  which transformers computes at any grid, its square position table
  resized per image as ours is."""
  cannot = [part for key, part in (
      ("conv_root/kernel", "a hybrid's ResNet stem"),
      ("pre_logits/kernel", "a pre-logits layer"),
      ("fc_norm/scale", "final_norm 'pooled'"),
      (torch_layouts.BLOCK.format(0) + "MlpBlock_3/Dense_gate/kernel",
       "a SwiGLU MLP (mlp 'swiglu')"),
      (torch_layouts.REGISTERS, "register tokens"),
      (torch_layouts.BLOCK.format(0) + "ls1", "layer scale"),
      (torch_layouts.BLOCK.format(0) + torch_layouts.ATTENTION
       + "/query_norm/scale", "query/key norms")) if key in flat]
  cannot += _function_cannot(function)
  if models.POSEMB_KEY not in flat:
    cannot.append("a position embedding other than 'learn'")
  _refuse(what, "as a Siglip2VisionModel", cannot)
  sizes = _sizes(flat)
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
  tensors = torch_layouts.from_release(flat, "siglip2",
                                       prefix="vision_model.")
  # torch's nn.MultiheadAttention names its fused projection so.
  tensors = {name.replace("in_proj.", "in_proj_"): value
             for name, value in tensors.items()}
  write_safetensors(tensors, paths.join(directory, HF_WEIGHTS))
  paths.write_atomically(paths.join(directory, HF_CONFIG),
                         json.dumps(config, indent=2))


def write_timm(path, flat, function, what, image_size=None):
  """A timm state dict; returns the Python lines that load it into timm's
  VisionTransformer (a model with a distillation token: DeiT's
  VisionTransformerDistilled; with 2-D rotary embeddings, its Eva:
  `write_eva`), whose arguments a state dict does not record."""
  if function["rope"]:
    return write_eva(path, flat, function, image_size, what)
  _check_writable(flat, function, "timm", what)
  sizes = _sizes(flat)
  architecture = models.architecture_of(flat)
  registers = architecture["num_registers"]
  if registers:
    # timm adds the position embedding to its register tokens too: ours
    # get none, a zero row each.
    posemb = flat[models.POSEMB_KEY]
    first = int("cls" in flat)
    flat = {**flat, models.POSEMB_KEY: np.concatenate([
        posemb[:, :first], np.zeros((1, registers, posemb.shape[2]),
                                    posemb.dtype), posemb[:, first:]], axis=1)}
  write_safetensors(torch_layouts.from_release(flat, "timm"), path)
  arguments = dict(
      img_size=sizes["image_size"], patch_size=sizes["patch_size"],
      embed_dim=sizes["hidden_size"], depth=sizes["num_layers"],
      num_heads=sizes["num_heads"],
      mlp_ratio=sizes["mlp_dim"] / sizes["hidden_size"],
      num_classes=sizes["num_classes"], class_token="cls" in flat,
      global_pool={"token": "token", "gap": "avg", "map": "map"}[
          architecture["classifier"]],
      fc_norm=function["final_norm"] == "pooled")
  if registers:
    arguments["reg_tokens"] = registers
  if architecture["layer_scale"] is not None:
    arguments["init_values"] = architecture["layer_scale"]
  if architecture["qk_norm"]:
    arguments["qk_norm"] = True
  if function["gelu"] == "tanh":
    arguments["act_layer"] = "gelu_tanh"
  model_class = ("deit.VisionTransformerDistilled"
                 if architecture["distill_token"]
                 else "vision_transformer.VisionTransformer")
  return _timm_lines(path, model_class, arguments,
                     function["layer_norm_epsilon"])


def _timm_lines(path, model_class, arguments, epsilon):
  """The Python lines that build timm's `model_class` (under timm.models)
  with `arguments` and load the state dict at `path` into it."""
  text = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
  if epsilon != TIMM_FUNCTION["layer_norm_epsilon"]:
    text += (", norm_layer=functools.partial(timm.layers.LayerNorm, "
             f"eps={epsilon!r})")
  copy = ""
  if paths.is_url(path):  # safetensors.torch reads local files only.
    copy = f"# first: gsutil cp {path} .\n"
    path = paths.path(path).name
  return (f"{copy}import functools, safetensors.torch, timm\n"
          f"model = timm.models.{model_class}({text})\n"
          f"model.load_state_dict(safetensors.torch.load_file({path!r}))")


def write_eva(path, flat, function, image_size, what):
  """A timm Eva state dict of a model with 2-D RoPE, laid out as timm's
  DINOv3 ports (rope "axial", no position table) or its RoPE ViTs ("index"
  or "mixed", with or without a table) are (`_eva_kind`); returns the lines
  that load it. A model that pools the patch tokens writes its first
  register as Eva's class token, which its average leaves out as it
  leaves out the registers: a timm Eva read and written is the same file.
  A DINOv3's query and value biases are written where any is not zero,
  its key bias must be zero (its Eva has none); a RoPE ViT keeps its
  fused bias, its query and key channels in timm's order."""
  kind = function["rope"]
  architecture = models.architecture_of(flat)
  table = models.POSEMB_KEY in flat
  cannot = _eva_family_cannot(flat)
  if not kind:
    cannot.append("no 2-D rotary embeddings")
  if kind == "axial" and table:
    cannot.append("a position table beside rope 'axial'")
  if table and torch_layouts.REGISTERS in flat:
    cannot.append("registers beside a position table")
  if function["gelu"] != "exact" and architecture["mlp"] == "gelu":
    cannot.append("the tanh GELU")
  sizes = _sizes(flat)
  keys = [torch_layouts.BLOCK.format(i) + torch_layouts.ATTENTION +
          "/key/bias" for i in range(sizes["num_layers"])]
  if kind == "axial" and any(np.any(flat.get(key, 0)) for key in keys):
    cannot.append("a key bias (--format=hf writes it)")
  _refuse(what, "as a timm Eva", cannot)
  flat = dict(flat)
  registers = flat.pop(torch_layouts.REGISTERS, None)
  if "cls" not in flat and registers is not None:
    flat["cls"], registers = registers[:, :1], registers[:, 1:]
  if registers is not None and registers.shape[1]:
    flat[torch_layouts.REGISTERS] = registers
  # A class token's row of zeros is timm's no_embed_class (its RoPE ViTs').
  no_embed_class = table and "cls" in flat and architecture[
      "classifier"] == "token" and not flat[models.POSEMB_KEY][:, 0].any()
  if no_embed_class:
    flat[models.POSEMB_KEY] = flat[models.POSEMB_KEY][:, 1:]
  tensors = torch_layouts.from_release(flat, "timm")
  qkv_bias = kind != "axial"
  if kind == "axial":
    for name in [n for n in tensors if n.endswith(".attn.qkv.bias")]:
      q, _, v = np.split(tensors.pop(name), 3)
      if q.any() or v.any():
        qkv_bias = True
        attn = name[:-len("qkv.bias")]
        tensors[attn + "q_bias"], tensors[attn + "v_bias"] = q, v
    if qkv_bias:  # Every block then has both, zeros included.
      for name in [n for n in tensors if n.endswith(".attn.qkv.weight")]:
        zeros = np.zeros(tensors[name].shape[0] // 3, tensors[name].dtype)
        tensors.setdefault(name[:-len("qkv.weight")] + "q_bias", zeros)
        tensors.setdefault(name[:-len("qkv.weight")] + "v_bias", zeros)
  else:
    perm = _rope_channels(sizes["hidden_size"] // sizes["num_heads"], kind)
    tensors = _permute_queries_and_keys(tensors, sizes["num_heads"],
                                        np.argsort(perm))
    if kind == "mixed":
      tensors["rope.freqs"] = np.stack(
          [tensors.pop(f"blocks.{i}.attn.rope_freqs")
           for i in range(sizes["num_layers"])], axis=1)
  swiglu = architecture["mlp"] == "swiglu"
  tensors = {re.sub(r"\.mlp\.fc1\.", ".mlp.fc1_x." if swiglu else ".mlp.fc1.",
                    re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", name)): value
             for name, value in tensors.items()}
  write_safetensors(tensors, path)
  arguments = dict(
      img_size=int(sizes["image_size"] or image_size or
                   EVA_IMAGE_SIZES["dinov3" if kind == "axial" else kind]),
      patch_size=sizes["patch_size"], embed_dim=sizes["hidden_size"],
      depth=sizes["num_layers"], num_heads=sizes["num_heads"],
      mlp_ratio=sizes["mlp_dim"] / sizes["hidden_size"],
      num_classes=sizes["num_classes"],
      global_pool="token" if architecture["classifier"] == "token" else "avg",
      class_token="cls" in flat,
      num_reg_tokens=0 if torch_layouts.REGISTERS not in flat else int(
          flat[torch_layouts.REGISTERS].shape[1]),
      qkv_bias=qkv_bias, use_abs_pos_emb=table, use_rot_pos_emb=True,
      rope_temperature=function["rope_theta"], use_fc_norm=False,
      dynamic_img_size=True)
  if kind == "axial":
    arguments.update(rope_type="dinov3", rope_rotate_half=True)
  else:
    arguments.update(attn_type="rope", rope_type={
        "index": "cat", "mixed": "mixed"}[kind], rope_grid_indexing="xy")
  if swiglu:  # Eva's separate gate and input Linears (its SwiGLU class).
    arguments.update(swiglu_mlp=True, swiglu_align_to=1)
  if no_embed_class:
    arguments["no_embed_class"] = True
  if architecture["layer_scale"] is not None:
    arguments["init_values"] = architecture["layer_scale"]
  return _timm_lines(path, "eva.Eva", arguments,
                     function["layer_norm_epsilon"])
