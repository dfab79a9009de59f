"""A model written for other code (vit_jax.export): its params in the
layouts other code reads, or its whole function.

npz is the release's layout (npz_lib.save_npz); hf and timm are PyTorch's
(pytorch/). Only npz holds every vit_jax model; the PyTorch layouts
refuse what their models cannot compute, naming it. stablehlo and onnx
hold the function itself, which runs without vit_jax
(function_exports.py).
"""

import dataclasses

import flax
import numpy as np

from vit_jax import errors, models, paths
from vit_jax.data import image_files
from vit_jax.weights import (
  big_vision,
  function_exports,
  npz as npz_lib,
  pretrained,
)
from vit_jax.weights.pytorch import (
  files,
  hf,
  hf_dino,
  mae as pytorch_mae,
  siglip as pytorch_siglip,
  timm,
)

FORMATS = ("npz", "hf", "timm", "stablehlo", "onnx")
# The ending of each format's file name, by which it is read back ("hf"
# writes a folder).
SUFFIXES = {"npz": ".npz", "timm": ".safetensors", "stablehlo": ".stablehlo",
            "onnx": ".onnx"}
# The formats that hold the model's function rather than its params.
FUNCTIONS = ("stablehlo", "onnx")


def check_out(format_, out):
  """Refuses `out` (--out) whose name does not say what `format_` writes:
  the readers of vit_jax and of other libraries go by the name."""
  name = paths.path(out).name
  wanted = SUFFIXES.get(format_)
  if wanted and not name.endswith(wanted):
    raise errors.InputError(
        f"--out={out}: --format={format_} writes a {wanted} file, which is "
        f"read back by that ending: name it {name.rsplit('.', 1)[0]}{wanted}"
        f" (or give the --format its name says)")
  if not wanted and name.endswith(tuple(SUFFIXES.values())):
    raise errors.InputError(
        f"--out={out}: --format={format_} writes a folder; a name ending in "
        f".{name.rsplit('.', 1)[1]} says another format (--format=" +
        next(f for f, s in SUFFIXES.items() if name.endswith(s)) + ")")


def check_out_place(format_, out):
  """Refuses `out` (--out) where something of the other kind is there: a
  file where `format_` writes a directory (hf), a directory where it
  writes a file. Asked once the path is known to be reachable."""
  found = paths.path(out)
  if format_ not in SUFFIXES and found.is_file():
    raise errors.InputError(
        f"--out={out} is an existing file, and --format={format_} writes a "
        "directory (config.json, model.safetensors): give a directory's "
        "path")
  if format_ in SUFFIXES and found.is_dir():
    raise errors.InputError(
        f"--out={out} is an existing directory, and --format={format_} "
        f"writes a file: give the path of a {SUFFIXES[format_]} file")


def function_warnings(loaded, format_):
  """What an .npz loses: it records sizes, not the LayerNorm epsilon or
  the GELU, so a model with other values than the release's needs them
  set again by whoever loads it."""
  if format_ != "npz":
    return []
  differ = {key: value for key, value in loaded.function.items()
            if key != "final_norm" and value != models.FUNCTION_OPTIONS[key]}
  if not differ:
    return []
  settings = " ".join(f"--config.model.{key}={value}"
                      for key, value in differ.items())
  return [f"{loaded.what} computes with {differ}, which an .npz does not "
          f"record: give {settings} when you fine-tune from it, or export "
          "--format=hf or timm, which record them"]


def write(loaded, format_, out, labels_file="", platforms=("cpu",)):
  """Writes a pretrained.Checkpoint to `out` in `format_`; returns how to
  load it, or "". `platforms`: those a StableHLO module is lowered for."""
  if loaded.towers is not None and loaded.config is not None:
    if format_ not in ("hf", "npz"):
      raise errors.InputError(
          f"{loaded.what} is a two-tower image_text run: it exports as "
          "--format=hf (transformers' SiglipModel) or npz (big_vision's "
          f"two towers), or as a zero-shot classifier of --class_names "
          f"(--format={format_} --class_names=NAME,...)")
    if format_ == "npz":  # Both towers, as big_vision's SigLIP files.
      big_vision.write(out, models.two_towers_from_settings(
          loaded.config.model, loaded.config.image_text), loaded.towers)
      return ("big_vision's two towers; its image tower alone is any "
              "reader's of an .npz")
  if format_ == "npz":
    npz_lib.save_npz(loaded.params, out)
    return ""
  if format_ in FUNCTIONS:
    return write_function(pretrained.inference_of(loaded), format_, out,
                          class_names(loaded, labels_file), platforms)
  flat = flax.traverse_util.flatten_dict(loaded.params, sep="/")
  dino = loaded.config is not None and loaded.config.objective == "dino"
  mask = None
  if dino:
    flat, mask = hf_dino.dino_backbone(flat)  # Training's parts left out.
  # Where no position table says it.
  image_size = loaded.image_size or (
      loaded.config.image_size if loaded.config else None)
  if format_ == "hf":
    kind, left_out = "ViTForImageClassification", ""
    if loaded.config is not None and loaded.config.objective == "image_text":
      # A NaFlex run's towers as SigLIP 2's, which read images so.
      naflex = bool(loaded.config.naflex.max_num_patches)
      kind = "Siglip2Model" if naflex else "SiglipModel"
      pytorch_siglip.write_two_towers(
          out, models.two_towers_from_settings(
              loaded.config.model, loaded.config.image_text),
          loaded.towers, "siglip2" if naflex else "siglip")
    elif loaded.config is not None and loaded.config.objective == "mae":
      kind = "ViTMAEForPreTraining"
      pytorch_mae.write_mae(out, models.masked_autoencoder_from_settings(
          loaded.config.model, loaded.config.mae), loaded.params,
                            loaded.config.mae.norm_pix_loss, image_size)
    elif dino and not loaded.function["rope"]:
      kind = hf_dino.write_dinov2(out, flat, loaded.function, loaded.what,
                                  mask)
    elif loaded.function["rope"]:
      kind = "DINOv3ViTModel"
      classes = hf_dino.write_dinov3(
          out, flat, loaded.function, image_size, loaded.what,
          loaded.normalization or files.HALF, mask)
      if classes:
        left_out = (f" (its head of {classes} classes is left out: a "
                    "DINOv3ViTModel has none; --format=npz keeps it)")
    elif hf.is_siglip_tower(flat):
      kind = "Siglip2VisionModel"
      hf.write_siglip2(out, flat, loaded.function, loaded.what)
    else:
      hf.write_hf(out, flat, loaded.function,
                  class_names(loaded, labels_file), loaded.what)
    # transformers reads local folders.
    copy, where = _copied_here(out, "gsutil -m cp -r")
    return (f"{copy}load it with transformers.{kind}"
            f".from_pretrained({where!r}){left_out}")
  return "load it in PyTorch with:\n" + timm.write_timm(
      out, flat, loaded.function, loaded.what, image_size)


def write_function(model, format_, out, names=None, platforms=("cpu",)):
  """Writes `model` (a function_exports.Function, or a classifier's
  pretrained.Inference) to `out` as `format_`, one of FUNCTIONS, its
  classes called `names`; returns how to run it."""
  function = function_exports.function_of(model)
  if format_ == "stablehlo":
    function_exports.write_stablehlo(function, out, names, platforms)
    # serving.py, copied alone, reads local files.
    copy, where = _copied_here(out, "gsutil cp")
    return (f"{copy}run it with vit_jax/serving.py (JAX and numpy only): "
            f"serving.load({where!r}), or python -m vit_jax.predict "
            f"--from={paths.shown(out)} IMAGES")
  function_exports.write_onnx(function, out, names)
  return ("run it with ONNX Runtime: input 'pixels', uint8 [batch, "
          f"{function.image_size}, {function.image_size}, 3]; outputs "
          f"{', '.join(function.outputs)}")


def _copied_here(out, command):
  """(what a hint says first, the path it then names) for an export at
  `out` that its reader opens locally: for a URL, a copy by `command` to
  the current folder, then the copy's name."""
  if not paths.is_url(out):
    return "", paths.shown(out)
  return (f"copy it here ({command} {paths.shown(out)} .) and ",
          paths.path(out).name)


def class_names(loaded, labels_file=""):
  """The class names an export records: the labels file's, else the
  source's (an HF config's id2label), else the run's dataset's; or None."""
  config = loaded.config
  return (image_files.name_classes(labels_file) or loaded.class_names or
          (image_files.name_classes("", config.dataset, config.data_dir or
                                    None) if config else None))


def fold_input_normalization(loaded, mean, std):
  """A pretrained.Checkpoint changed to take vit_jax's images, NHWC in [-1, 1], where it
  was trained on (pixels / 255 - mean) / std per RGB channel (timm's
  ImageNet mean and std, for one). The patch embedding is linear and
  unpadded, so folding the affine map into its kernel and bias is exact but
  for float rounding: with x = 2 * pixels / 255 - 1, the model's input is
  x / (2 std) + (0.5 - mean) / std."""
  mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
  if mean.shape != (3,) or std.shape != (3,) or (std <= 0).any():
    raise errors.InputError(
        f"input mean and std take 3 values each (RGB), std > 0; got "
        f"{mean.tolist()} and {std.tolist()}")
  if "conv_root" in loaded.params:
    raise errors.InputError(
        "a hybrid's ResNet stem standardises its weights and pads its "
        "input: its input normalisation cannot be folded into it")
  embedding = loaded.params["embedding"]
  kernel = np.asarray(embedding["kernel"], np.float64)
  bias = embedding["bias"] + np.einsum("ijcd,c->d", kernel, (0.5 - mean) / std)
  folded = {"kernel": (kernel / (2 * std)[:, None]).astype(np.float32),
            "bias": bias.astype(np.float32)}
  return dataclasses.replace(loaded, params={**loaded.params,
                                             "embedding": folded})


def in_own_input(loaded, given=None, say=lambda line: None,
                 setters=files.FLAGS):
  """`loaded` changed to compute on vit_jax's images ([-1, 1]) what it
  computes on its own input: `given` (a files.Normalization), else
  its source's (an HF directory's image processor, a timm hub config's,
  or the family's), folded into its patch embedding
  (`fold_input_normalization`). Where the source says none (a timm file
  off the hub) `say` is told in one line what is assumed and how to
  change it: by `setters` (files.Setters: the tools' flags, or a
  run's config keys). A run's and an .npz's input is vit_jax's
  own: they are left as they are."""
  normalization = given or loaded.normalization
  if normalization is None:
    return loaded
  if normalization.said_by is None:
    say(f"note: {loaded.what} says nothing of its input; assuming "
        f"{normalization.named(setters)} ({setters.how} to change it)")
  if (normalization.mean, normalization.std) == (
      files.HALF.mean, files.HALF.std):
    return loaded
  return fold_input_normalization(loaded, normalization.mean,
                                  normalization.std)
