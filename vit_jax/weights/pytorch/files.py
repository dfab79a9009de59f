"""What the PyTorch interchange's families share: safetensors files read
and written as numpy (through safetensors' numpy API), PyTorch pickles
refused (unpickling runs whatever code the file holds), JSON configs, a
model's input normalization, and the checks of what a PyTorch layout can
hold. Files may be local or URLs (`gs://`), read and written through
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
from vit_jax.weights.pytorch import layouts

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# What timm's ViTs compute by default: a timm file's function (timm.py),
# and what the lines that load a written file into timm need not name.
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


def read_json(path):
  file = paths.path(path)
  # Asked first: a missing object is not a FileNotFoundError on every
  # file system epath speaks.
  if not file.exists():
    raise errors.InputError(f"{path} does not exist")
  try:
    return json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise errors.InputError(f"{path} is not JSON: {e}") from e


def is_square(n):
  return int(round(np.sqrt(n))) ** 2 == n


def without_key_bias(flat):
  """Release-layout `flat` without the attention's key biases, which
  the readers filled with zeros where the source has none: such a model
  (model.key_bias off) keeps none, so that fine-tuning trains none."""
  return {key: value for key, value in flat.items()
          if not (key.startswith("Transformer/encoderblock_")
                  and key.endswith(f"/{layouts.ATTENTION}/key/bias"))}


def function_cannot(function):
  """What of `function` no PyTorch layout written here computes."""
  if function["rope"]:
    return [f"2-D rotary embeddings (rope {function['rope']!r})"]
  return []


def refuse(what, target, cannot):
  """InputError naming what of `what` cannot be written `target` ("as a
  DINOv3ViTModel", ...), where `cannot` lists anything."""
  if cannot:
    raise errors.InputError(
        f"{what} cannot be written {target}: the model has "
        f"{'; '.join(cannot)}. --format=npz writes any of vit_jax's models")


def check_writable(flat, function, layout, what):
  """InputError unless `flat`, computing `function`, is a ViT the layout
  can hold."""
  cannot = function_cannot(function)
  if "conv_root/kernel" in flat:
    cannot.append("a hybrid's ResNet stem")
  if models.POSEMB_KEY not in flat:
    cannot.append("a position embedding other than 'learn'")
  if layouts.BLOCK.format(0) + "MlpBlock_3/Dense_gate/kernel" in flat:
    cannot.append("a SwiGLU MLP (mlp 'swiglu')")
  if "mpp_head/kernel" in flat:
    cannot.append("a masked patch prediction head")
  # timm's VisionTransformer without a head is num_classes=0 (its features,
  # as a self-distilled teacher is); HF's ViTForImageClassification has one.
  if layout == "hf" and "head/kernel" not in flat:
    cannot.append("no classification head")
  if "pre_logits/kernel" in flat:
    cannot.append("a pre-logits layer (fine-tuned models have none)")
  if layout == "hf" and "cls" not in flat:
    cannot.append("no class token (classifier 'gap')")
  if layout == "hf" and "fc_norm/scale" in flat:
    cannot.append("final_norm 'pooled'")
  if "dist" in flat and layouts.REGISTERS in flat:
    cannot.append("a distillation token beside registers")
  # The parts of today's checkpoints (docs/models.md, "Today's options"):
  # timm's VisionTransformer has them all, HF's ViT none.
  block = layouts.BLOCK.format(0)
  for key, part in ((layouts.MAP_PROBE, "attention pooling "
                     "(classifier 'map')"), (block + "ls1", "layer scale"),
                    (layouts.REGISTERS, "register tokens"),
                    ("dist", "a distillation token"),
                    (block + layouts.ATTENTION + "/query_norm/scale",
                     "query/key norms")):
    if layout == "hf" and key in flat:
      cannot.append(part + " (--format=timm writes it)")
  refuse(what, f"for {layout}", cannot)


def sizes(flat):
  """The sizes of release-layout params; image_size None where no learned
  table says it."""
  patch, _, _, hidden = flat["embedding/kernel"].shape
  image_size = None
  if models.POSEMB_KEY in flat:
    tokens = flat[models.POSEMB_KEY].shape[1] - models.posemb_prefix(flat)
    image_size = models.grid_side(tokens, models.POSEMB_KEY) * int(patch)
  query = flat[layouts.BLOCK.format(0) + layouts.ATTENTION +
               "/query/kernel"]
  return dict(
      patch_size=int(patch), hidden_size=int(hidden),
      num_heads=int(query.shape[1]),
      num_layers=len({k.split("/")[1] for k in flat
                      if k.startswith("Transformer/encoderblock_")}),
      mlp_dim=int(flat[layouts.BLOCK.format(0) +
                       "MlpBlock_3/Dense_0/kernel"].shape[1]),
      num_classes=(int(flat["head/kernel"].shape[1]) if "head/kernel" in flat
                   else 0),
      image_size=image_size)


def timm_lines(path, model_class, arguments, epsilon):
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
