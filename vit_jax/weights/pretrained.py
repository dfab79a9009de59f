"""Params to start a run from, to run on images, or to export.

A source is any of
  - an `.npz` in any layout `npz.load_npz` reads;
  - a Hugging Face transformers ViT directory (config.json and
    model.safetensors) or a timm `.safetensors` state dict
    (vit_jax/weights/pytorch/); PyTorch pickles are refused;
  - a workdir of ours, `DIR` (its newest checkpoint) or `DIR:STEP`: its
    Polyak average when it kept one, else its params;
  - a model on the Hugging Face hub by its name, `hf://ORG/NAME[@REVISION]`
    (a transformers or a timm repository), read from huggingface_hub's
    cache (vit_jax/weights/hub.py); a run records the commit it was.
`load` reads any of them to host memory as numpy in the release layout,
with the function it computes (models.FUNCTION_OPTIONS) and, where the
source names them, its classes; `with_source` gives a fine-tune its
source's function and architecture (models.SOURCE_OPTIONS).
`config.init_from` takes a source (`initial_params`, then
`adaptation.adapt` fits it to the new model; the new run's optimizer
starts fresh), and so does `for_inference` (vit_jax.predict,
vit_jax.figures, vit_jax.export).
"""

import dataclasses
import re
import zipfile

import flax
import flax.linen as nn
import jax
import numpy as np
from absl import logging

from vit_jax import errors, models, paths, serving
from vit_jax.models import naflex as naflex_lib
from vit_jax.runs import checkpoints, settings
from vit_jax.runs.workdir import Workdir
from vit_jax.weights import adaptation, big_vision, hub, npz
from vit_jax.weights.pytorch import files, hf, siglip as pytorch_siglip, timm


def parse_source(source):
  """"DIR:STEP" -> (DIR, STEP); any other source -> (source, None)."""
  match = re.fullmatch(r"(.+):(\d+)", source)
  if match and not source.endswith(FILE_SUFFIXES):
    return match.group(1), int(match.group(2))
  return source, None


FILE_SUFFIXES = (".npz", ".safetensors")
# What vit_jax.export --format=stablehlo|onnx writes: a function, no params.
FUNCTION_SUFFIXES = (".stablehlo", ".onnx")


def refuse_unreadable(path):
  """An InputError for files that hold no params vit_jax reads: PyTorch
  pickles (files.refuse_pickle) and exported functions."""
  if path.endswith(files.PICKLE_SUFFIXES):
    kind = export_kind(path)
    if kind:
      raise errors.InputError(
          f"{path} is, by its content, a vit_jax export ({kind}) named like "
          f"a PyTorch pickle: rename it to end in {kind}")
    files.refuse_pickle(path)
  if path.endswith(FUNCTION_SUFFIXES):
    raise errors.InputError(
        f"{path} is a model exported as a function (StableHLO or ONNX), "
        "which holds no params to read: give the run or the file it was "
        "exported from")


# What a source may be, for the messages that refuse one.
SOURCE_KINDS = ("a source is a workdir of ours, an .npz, an HF transformers "
                "directory, a timm .safetensors file or hf://ORG/NAME")


def refuse_missing(path):
  """An InputError where nothing is at `path` (a file, or a workdir, which
  would otherwise be said to hold no run)."""
  if not paths.path(path).exists():
    raise errors.InputError(f"{path} does not exist: {SOURCE_KINDS}")


def export_kind(path):
  """The suffix of the vit_jax export the file at `path` holds, read from
  its first bytes (".npz", ".safetensors" or ".stablehlo"), or None."""
  file = paths.path(path)
  if not file.is_file():
    return None
  with file.open("rb") as f:
    head = f.read(4096)
  if head.startswith(b"PK"):  # A zip: an .npz, or a StableHLO archive.
    try:
      with file.open("rb") as f, zipfile.ZipFile(f) as archive:
        names = archive.namelist()
    except zipfile.BadZipFile:
      return None
    if serving.MODULE in names:
      return ".stablehlo"
    if names and all(name.endswith(".npy") for name in names):
      return ".npz"
    return None
  # safetensors: an 8-byte little-endian header length, then its JSON.
  if len(head) > 9 and head[8:9] == b"{" and int.from_bytes(
      head[:8], "little") < 100_000_000:
    return ".safetensors"
  return None


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A source's params (numpy, release layout) and what comes with them."""
  params: dict
  what: str  # where they came from, for messages
  function: dict  # models.FUNCTION_OPTIONS values the source computes with
  class_names: list | None = None  # an HF config's id2label
  config: settings.Settings | None = None  # a run's
  image_size: int | None = None  # a file's that no position table says
  # The input it was trained on; None: vit_jax's own, [-1, 1] (a run's, an
  # .npz's).
  normalization: files.Normalization | None = None
  # A two-tower run's whole params (img, txt, t, b), where `params` are its
  # image tower's: what fine-tunes, predicts and exports as a ViT (a
  # two-tower file's: `two_towers_in`).
  towers: dict | None = None


def local(source):
  """Where `source` lies (a hub.Found): a hub name resolved to its
  directory or file in Hugging Face's cache, any other as it is. `load`
  and `source_options` read every source through here."""
  if hub.is_name(source):
    return hub.find(source)
  return hub.Found(source, source)


def load(source, num_heads=None):
  """The Checkpoint of `source`. `num_heads`: a timm file's head count,
  where its width is none of the paper's variants' (a hub name's timm
  config may say it)."""
  found = local(source)
  path, step = parse_source(found.path)
  num_heads = num_heads or found.num_heads
  refuse_unreadable(path)
  refuse_missing(path)
  if step is not None and (path.endswith(FILE_SUFFIXES) or
                           hf.is_hf_dir(path)):
    raise errors.InputError(f"{source!r}: only a workdir has steps")
  if path.endswith(".npz"):
    params = npz.load_npz(path)  # A two-tower file's image tower.
    return Checkpoint(params, found.what or path,
                      _function(flat_keys(params)))
  if path.endswith(".safetensors") or hf.is_hf_dir(path):
    read = (timm.read_timm(path, num_heads)
            if path.endswith(".safetensors") else hf.read_hf(path))
    return Checkpoint(flax.traverse_util.unflatten_dict(read.flat, sep="/"),
                      found.what or path, read.function, read.class_names,
                      image_size=read.image_size,
                      normalization=found.normalization or read.normalization)
  config = Workdir(path).read_config()
  params, what = load_run(path, step)
  towers = params if config.objective == "image_text" else None
  # A scanned run's stacked blocks, one per layer; a two-tower run's image
  # tower (under "img/", as big_vision's).
  params = flax.traverse_util.unflatten_dict(npz.to_release_layout(
      flax.traverse_util.flatten_dict(params, sep="/")), sep="/")
  return Checkpoint(params, what, run_function(config), config=config,
                    towers=towers)


def flat_keys(params):
  return flax.traverse_util.flatten_dict(params, sep="/").keys()


def _function(keys):
  """The function of release-layout params with these keys: the
  release's, with final_norm "pooled" where they hold an fc_norm, and
  rope "mixed" where its blocks hold RoPE frequencies."""
  function = {**models.FUNCTION_OPTIONS,
              "final_norm": "pooled" if any(k.endswith("fc_norm/scale")
                                            for k in keys) else "tokens"}
  if any(k.endswith("/rope_freqs") for k in keys):
    function["rope"] = "mixed"
  return function


def run_function(config):
  """The function a run of ours computes (runs recorded before the
  options existed computed the release's)."""
  return _options_of_run(config, models.FUNCTION_OPTIONS)


def _options_of_run(keys, options):
  return {key: default if getattr(keys.model, key) is None
          else getattr(keys.model, key) for key, default in options.items()}


def source_options(source):
  """The models.SOURCE_OPTIONS that `source` fixes: its function and the
  parts of its architecture that its sizes do not say. A run's are in its
  config; a file's from its names and shapes (headers, and an HF
  directory's config.json): no array is read, which `initial_params` then
  does once."""
  path, _ = parse_source(local(source).path)
  refuse_unreadable(path)
  refuse_missing(path)
  if path.endswith(".npz"):
    shapes = flax.traverse_util.flatten_dict(npz.read_shapes(path), sep="/")
    return _with_posemb({**_function(shapes),
                         **models.architecture_of(shapes)}, shapes)
  if path.endswith(".safetensors"):
    return timm.timm_options(path)
  if hf.is_hf_dir(path):
    return hf.hf_options(path)
  return _options_of_run(Workdir(path).read_config(),
                         models.SOURCE_OPTIONS)


def _with_posemb(options, keys):
  """`options` with the posemb that params of these keys say, where they
  say one."""
  posemb = models.posemb_of(keys, options)
  return options if posemb is None else {**options, "posemb": posemb}


def with_source(keys, recorded=None):
  """The Settings `keys` with their model's SOURCE_OPTIONS made explicit:
  those they leave unset (None) are the ones of the run's `recorded`
  Settings (None for a new run: a resumed run does not read init_from
  again), else its init_from's, so that a fine-tune computes its source's
  function with its source's architecture, else the defaults.

  A new run that sets a part of the architecture against its init_from (a
  classifier, registers, layer scale or query/key norms the source does
  not have) is refused, naming the keys; a function option it sets wins,
  with a warning where the source differs.

  A hub name is made the commit it resolves to, `hf://ORG/NAME@COMMIT`, as
  the run records it and `initial_params` reads it; a resumed run's name
  of the same repository is the one it recorded (hub.as_recorded).
  """
  init_from = keys.init_from
  if recorded is not None:
    source = _options_of_run(recorded, models.SOURCE_OPTIONS)
    init_from = hub.as_recorded(init_from, recorded.init_from)
  elif init_from:
    try:
      found = local(init_from)
      source = source_options(found.path)
    except (errors.InputError, OSError) as e:
      raise errors.ConfigError.of(e, "config.init_from", init_from) from e
    init_from = found.name
  else:
    source = {}
  filled, against = {}, []
  for key, default in models.SOURCE_OPTIONS.items():
    value = getattr(keys.model, key)
    if value is None:
      filled[key] = source.get(key, default)
    elif key in source and not _agrees(key, value, source[key]):
      if key in models.FUNCTION_OPTIONS:
        logging.warning("config.model.%s=%r, but init_from %s computes with "
                        "%r", key, value, init_from, source[key])
      elif recorded is None:  # A restart's changes are store.py's to judge.
        against.append(f"config.model.{key}={value!r} (the source's: "
                       f"{source[key]!r})")
  if against:
    raise errors.ConfigError(
        f"config.init_from={init_from!r} has another architecture "
        f"than the config sets: {'; '.join(against)}. Leave them unset to "
        "take the source's")
  return dataclasses.replace(
      keys, init_from=init_from,
      model=dataclasses.replace(keys.model, **filled))


def _agrees(key, value, source_value):
  if key == "layer_scale":  # Its initial value does not matter to loaded ones.
    return (value is None) == (source_value is None)
  return value == source_value


def load_run(workdir, step=None):
  """Params of step `step` (default: the newest whole one) of the run in
  `workdir`: its Polyak average when it kept one, else its params, verified
  as a resume verifies them (checkpoints.restore_newest_whole_params)."""
  workdir = Workdir(workdir)
  reader = workdir.params_reader()
  try:
    steps = reader.all_steps()
    if not steps:
      raise errors.InputError(
          f"{workdir} holds no checkpoint (looked in {workdir.checkpoints}); "
          f"{SOURCE_KINDS}")
    if step is not None and step not in steps:
      raise errors.InputError(
          f"{workdir} has no checkpoint of step {step}; its checkpoints are "
          f"of steps {', '.join(str(s) for s in sorted(steps))}")
    step, params, what = checkpoints.restore_newest_whole_params(reader, step)
  finally:
    reader.close()
  return params, f"{workdir} step {step} ({what})"


def two_towers_in(source):
  """Both towers of a two-tower file (transformers' SiglipModel or
  Siglip2Model directory, big_vision's two-tower .npz), a
  towers.TwoTowersRead, or None for any other source; read only where
  both are wanted (a classifier reads the image tower alone, `load`)."""
  path, _ = parse_source(local(source).path)
  if pytorch_siglip.is_two_towers(path):
    return pytorch_siglip.read_two_towers(path)
  if big_vision.is_two_towers(path):
    return big_vision.read(path)
  return None


def initial_params(source, param_shapes, num_heads, dataset=None):
  """Loads `source` and adapts it to a model with `num_heads` heads whose
  params have the shapes (jax.ShapeDtypeStructs) `param_shapes`, for a run
  on `dataset`.

  Returns a tree of numpy arrays, with the ShapeDtypeStructs of
  `param_shapes` left where the new model keeps its own initialisation (a
  new head). A run of ours on another dataset gives no head: its classes
  are not the new run's, whatever their count, and a fine-tune starts from
  a zero head as in the paper. Raises a ConfigError naming the key and
  both shapes when the checkpoint cannot fit. Nothing is compiled.
  """
  try:
    loaded = load(source, num_heads)
    logging.info("init_from: %s, %d params", loaded.what,
                 sum(np.size(x) for x in jax.tree.leaves(loaded.params)))
    params = loaded.params
    if set(param_shapes) >= {"img", "txt"}:  # Two towers (image_text).
      towers = loaded.towers
      if towers is None:
        read = two_towers_in(source)
        towers = None if read is None else read.params
      if towers is not None:
        return adaptation.adapt_two_towers(towers, param_shapes)
      # A ViT's: the image tower (LiT's start), the rest fresh.
      return {**param_shapes,
              "img": adaptation.adapt(params, param_shapes["img"])}
    if (loaded.config is not None and dataset is not None
        and loaded.config.dataset != dataset):
      params = {key: value for key, value in params.items()
                if key not in models.HEADS}
    return adaptation.adapt(params, param_shapes)
  except (errors.InputError, OSError) as e:  # What the user gave, named.
    raise errors.ConfigError.of(e, "config.init_from", source) from e


def place(adapted, fresh_params, shardings):
  """The adapted params as arrays sharded like `fresh_params`; the leaves
  `adapted` left to the model's initialisation come from `fresh_params`."""
  def put(value, fresh, sharding):
    if isinstance(value, jax.ShapeDtypeStruct):
      return fresh
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding,
                                        lambda index: value[index])
  return jax.tree.map(put, adapted, fresh_params, shardings,
                      is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


@dataclasses.dataclass(frozen=True)
class Inference:
  """A model and its params, ready to run on images; `model, params =
  inference` unpacks them."""
  model: nn.Module  # float32, one module per block (no scan, no remat)
  params: dict  # numpy arrays in the release layout
  image_size: int  # the side its position embedding was trained at
  what: str  # where the params came from, for messages
  config: settings.Settings | None  # a run's; None for a file
  class_names: list | None = None  # an HF config's

  def __iter__(self):
    return iter((self.model, self.params))

  @property
  def crop_fraction(self):
    """How the run's evaluation resized images (1.0: plain resize)."""
    return self.config.eval_crop_fraction if self.config else 1.0

  @property
  def naflex(self):
    """How the run's evaluation cut its images into patches, a
    models.naflex.Budget: a NaFlex run's config.naflex.max_num_patches,
    each image at its own size where it was packed; None where it read
    square images, and for a file."""
    config = self.config
    if config is None:
      return None
    return naflex_lib.budget_of(config.naflex.max_num_patches, self.model,
                                config.naflex.packing)

  def data(self, dataset="", data_dir=""):
    """(dataset, data_dir or None): those given, else the run's."""
    config = self.config
    return (dataset or (config.dataset if config else ""),
            data_dir or (config.data_dir if config else "") or None)


def for_inference(source, num_heads=None, features=False):
  """inference_of(load(source, num_heads), features)."""
  return inference_of(load(source, num_heads), features)


def inference_of(loaded, features=False):
  """The model of a Checkpoint, with its params.

  The architecture is read from the params' shapes (`models.from_params`),
  so a file needs no config, and the function from the source. (An .npz
  whose position embedding has no params, "sincos2d" or "none", needs its
  run's workdir instead.) A source with no classification head (an HF
  ViTModel, a SigLIP tower, a DINOv2, a timm model saved without one) is
  refused, unless only its `features` are wanted (what the head would
  read, vit_jax.analysis.features): then it gets a head of no classes
  (`models.placeholder_head`).
  """
  config = loaded.config
  if "head" not in loaded.params and not features:
    raise errors.InputError(
        f"{loaded.what} has no classification head (an HF ViTModel, a "
        "SigLIP tower, a DINOv2 or a headless timm model): compute its "
        "features (python -m vit_jax.predict --features), or give it to "
        "config.init_from to fine-tune one")
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), loaded.params)
  if "head" not in params:  # A distillation token's head too.
    params = {**params, **{name: models.placeholder_head(params) for name in
                           models.HEADS[:1 + ("dist" in params)]}}
  # final_norm is read from the params (an fc_norm).
  model, image_size = models.from_params(
      params, config.model.posemb if config else None,
      **{key: value for key, value in loaded.function.items()
         if key != "final_norm"})
  image_size = image_size or loaded.image_size or (
      config.image_size if config else None)
  if image_size is None:
    raise errors.InputError(
        f"{loaded.what} has no position table and says no image size: "
        "run it from its run's workdir")
  return Inference(model, params, image_size, loaded.what, config,
                   loaded.class_names)

