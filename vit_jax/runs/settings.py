"""Every config key in one place: its default, its type, its bounds, a
line on what it means, and what a restart may make of it.

A config file stays an ml-collections ConfigDict (configs/base.py is
`defaults()`, and `--config.KEY=VALUE` sets any key); `of(config)` turns a
complete one into `Settings`, frozen dataclasses whose fields are the keys,
checking each bounded value on the way, a slip named by its key. What
needs more than the value to check (a dataset's splits, the mesh, an
augmentation's name) is checked where it is used (training/resolve.py).

A restart may change the keys marked `changeable` (runs/store.py refuses
any other change): how often a run reports and saves, how long it runs
(extending it), where its data is stored, what it evaluates and what it
recomputes (neither changes what it trains), and the hardware it runs on:
the mesh, and the micro-batches a smaller slice needs to hold the same
global batch (data/shares.py keeps the batches); folder_contents, a change
that training/resolve.py refuses unless the user names it. A key added
since runs were first recorded carries `before`: the value that does what
a run recorded without it did, or RESOLVED, whatever the restart resolves
it to.

docs/config.md's "Config keys" table names every key here, and every key
has a description (tests/test_readme.py, tests/test_settings.py).
"""

import dataclasses
import types
from typing import Optional

import ml_collections

from vit_jax import errors
from vit_jax.models import options
from vit_jax.models.config import ViTConfig
from vit_jax.runs.objective_settings import DINO, MAE, ImageText

key = options.key
ORIGINAL, RESOLVED, AS_DEFAULT = (options.ORIGINAL, options.RESOLVED,
                                  options.AS_DEFAULT)


def section(make, description, *, changeable=False):
  """A field holding a nested section, `make()` its defaults; a restart
  may change all of it where `changeable`, else the keys it marks."""
  return dataclasses.field(default_factory=make, metadata={
      "description": description, "changeable": changeable})


def _model_section():
  """config.model: `name`, each of ViTConfig's fields as it declares it
  (at its config default: unset, None, where the name or init_from says
  it, "auto" where the run resolves it), and `mpp`."""
  fields = [("name", str, key("", 'a size of Table 1, "B/16", or a hybrid, '
                              '"R50+B/16"'))]
  for field in dataclasses.fields(ViTConfig):
    metadata = dict(field.metadata)
    default = metadata.pop("config")
    if default is options.SAME:
      default = field.default
    if default == "auto":  # A value the run resolves, beside the model's.
      metadata["choices"] = (*metadata["choices"], "auto")
    kind = Optional[field.type] if default is None else field.type
    fields.append((field.name, kind, key(default, **metadata)))
  fields.append(("mpp", bool, key(False, "pre-train by masked patch "
                                  "prediction (configs/mpp.py)",
                                  before=AS_DEFAULT)))
  return dataclasses.make_dataclass(
      "Model", fields, frozen=True, namespace={"__module__": __name__,
          "__doc__": "config.model: `name` and an override of each of "
                     "models.create's fields (docs/config.md, "
                     "\"Models\"); None "
                     "leaves a field as the name, init_from, else the "
                     "paper's ViT sets it."})


Model = _model_section()


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """config.optimizer (training/optimizer.py)."""
  name: str = key("", "adam, muon, sgd or lars")
  learning_rate: float = key(0.0, "the peak learning rate", at_least=0.0)
  warmup_steps: int = key(0, "steps of linear warm-up from 0", at_least=0)
  decay: str = key("", "after the warm-up: linear or cosine to 0, or wsd "
                   "(stable, then to 0 over the last wsd_fraction)")
  wsd_fraction: float = key(0.2, "wsd: the fraction of total_steps that "
                            "decays to 0", at_least=0.0, at_most=1.0,
                            changeable=True, before=AS_DEFAULT)
  wsd_shape: str = key("1-sqrt", "wsd: the decay's shape, linear or 1-sqrt",
                       choices=("linear", "1-sqrt"), changeable=True,
                       before=AS_DEFAULT)
  weight_decay: float = key(0.0, "decoupled weight decay, of the kernels "
                            "only", at_least=0.0)
  weight_decay_end: Optional[float] = key(
      None, "adam: the weight decay at the last step, reached from "
      "weight_decay by a cosine (DINOv2's 0.04 -> 0.4); unset: constant",
      at_least=0.0, before=None)
  grad_clip_norm: float = key(0.0, "the global gradient norm clipped to "
                              "(0: none)", at_least=0.0)
  b1: float = key(0.9, "Adam's first-moment decay", at_least=0.0, below=1.0)
  b2: float = key(0.999, "Adam's second-moment decay", at_least=0.0,
                  below=1.0)
  mu_dtype: str = key("float32", "Adam's first moment: float32 or bfloat16 "
                      "(half its bytes, as big_vision keeps it)",
                      before=AS_DEFAULT)
  momentum: float = key(0.9, "SGD's and LARS's momentum", at_least=0.0,
                        below=1.0)
  layer_decay: float = key(1.0, "block i of L learns at layer_decay^(L - i) "
                           "of the rate (1: off)", before=AS_DEFAULT)
  lr_mults: tuple = key((), "((regex, multiplier), ...): the rates of the "
                        "parameters each regex matches", before=AS_DEFAULT)
  frozen: str = key("", "a regex of parameters not trained, with no "
                    "optimizer state", before=AS_DEFAULT)
  adam_learning_rate: Optional[float] = key(
      None, "muon: the peak rate of the parameters AdamW trains (unset: "
      "learning_rate)", at_least=0.0, before=None)
  muon_beta: float = key(0.95, "muon: its momentum's decay", at_least=0.0,
                         below=1.0, before=AS_DEFAULT)
  muon_per_head: bool = key(False, "muon: each head's attention matrices "
                            "orthogonalised alone (else each projection)",
                            before=AS_DEFAULT)
  muon_consistent_rms: float = key(
      0.2, "muon: the updates' RMS, AdamW's (timm's); 0: scaled by "
      "sqrt(max(1, fan_out / fan_in)) (optax's)",
      at_least=0.0, before=AS_DEFAULT)
  muon_adaptive: bool = key(False, "muon: each update scaled by the dual "
                            "norm of its momentum (optax's adaptive)",
                            before=AS_DEFAULT)
  muon_preconditioning: str = key(
      "frobenius", "muon: the normalisation before Newton-Schulz (optax's "
      "frobenius, spectral, aol or schatten)",
      choices=("frobenius", "spectral", "aol", "schatten"), before=AS_DEFAULT)


@dataclasses.dataclass(frozen=True)
class Mix:
  """config.mixup and config.cutmix (training/targets.py)."""
  prob: float = key(0.0, "the probability that a batch is mixed",
                    at_least=0.0, at_most=1.0, before=AS_DEFAULT)
  alpha: float = key(1.0, "the mixing ratio's Beta(alpha, alpha)",
                     before=AS_DEFAULT)


@dataclasses.dataclass(frozen=True)
class NaFlex:
  """config.naflex: images at their own aspect ratio (models/naflex.py)."""
  max_num_patches: int = key(
      0, "each image resized, keeping its aspect ratio, to at most this "
      "many patches (0: square images at image_size)", at_least=0,
      before=AS_DEFAULT)
  packing: bool = key(
      False, "several training images a sequence, each at its own size "
      "(NaViT); batch_size counts sequences (data/packing.py)",
      before=AS_DEFAULT)
  images_per_sequence: float = key(
      2.0, "packing: the images read for each sequence of a step (more: "
      "less padding, more images left over)", at_least=1.0,
      before=AS_DEFAULT)
  max_images_per_sequence: int = key(
      0, "packing: the most images one sequence holds (0: twice "
      "images_per_sequence, rounded up)", at_least=0, before=AS_DEFAULT)
  min_side: int = key(
      0, "packing: each training image resized to an area of s x s pixels, "
      "s uniform in [min_side, max_side] (0: off)", at_least=0,
      before=AS_DEFAULT)
  max_side: int = key(0, "packing: see min_side", at_least=0,
                      before=AS_DEFAULT)
  token_drop: float = key(
      0.0, "packing: the share of each training image's patches left out "
      "at random", at_least=0.0, below=1.0, before=AS_DEFAULT)
  token_drop_sampled: bool = key(
      False, "packing: each image's share drawn uniformly from [0, 2 x "
      "token_drop] instead", before=AS_DEFAULT)


@dataclasses.dataclass(frozen=True)
class Distill:
  """config.distill: a frozen teacher's outputs as the student's targets
  (training/distill.py)."""
  teacher: str = key("", "the teacher, any source init_from takes ('': "
                     "none); it sees the student's batch at its own "
                     "resolution", before=AS_DEFAULT)
  kind: str = key("soft", "soft: KL divergence from the teacher's softened "
                  "probabilities; hard: cross-entropy with its top class "
                  "(DeiT's)", before=AS_DEFAULT)
  temperature: float = key(1.0, "the softmax temperature of soft "
                           "distillation (the KL term is scaled by its "
                           "square)", at_least=0.0, before=AS_DEFAULT)
  label_weight: float = key(0.0, "the label loss's share of the loss (0: "
                            "pure function matching)", at_least=0.0,
                            at_most=1.0, before=AS_DEFAULT)
  teacher_mean: tuple = key(
      (), "R,G,B in [0, 1]: the teacher takes (pixels / 255 - mean) / std; "
      "(): as its source says, else assumed", before=AS_DEFAULT)
  teacher_std: tuple = key(
      (), "R,G,B > 0: the teacher's input std, with teacher_mean; (): as its "
      "source says, else assumed", before=AS_DEFAULT)


@dataclasses.dataclass(frozen=True)
class Mesh:
  """config.mesh: the device mesh's axes (sharding.py); one may be -1,
  the devices the others leave."""
  data: int = key(-1, "the data-parallel axis")
  fsdp: int = key(1, "the axis params and optimizer state are split over")
  model: int = key(1, "the tensor-parallel axis")
  slices: int = key(-1, "TPU slices the data axis spans (-1: as many as "
                    "the devices are in; on CPU a process stands for one)",
                    before=AS_DEFAULT)
  fsdp_min_bytes: int = key(
      0, "arrays of fewer bytes are held whole, not split over fsdp (0: "
      "all are split)", at_least=0, before=AS_DEFAULT)


@dataclasses.dataclass(frozen=True)
class Settings:
  """The whole config, typed and checked."""
  dataset: str = key("", "a TFDS name, digits, folder:PATH, captions:PATH "
                      "or vtab:TASK")
  data_dir: str = key("", "where TFDS datasets are prepared; '': TFDS's "
                      "default (or $TFDS_DATA_DIR)", changeable=True)
  train_split: str = key("train", "the TFDS split trained on (slices such "
                         "as train[:98%] work)")
  input_shares: Optional[int] = key(
      None, "the shares the training split is read in; unset: chosen at the "
      "start (data/shares.py) and recorded", at_least=1, before=RESOLVED)
  folder_contents: str = key(
      "", "a folder dataset's files as the run recorded them; naming new "
      "contents resumes on changed files (training/resolve.py)",
      changeable=True, before=RESOLVED)
  image_size: int = key(0, "the input resolution in pixels", at_least=1)
  augment: str = key("", "comma-separated: flip, shift, inception_crop, "
                     "mae_crop, random_crop (resize to 7/6, crop back)")
  randaugment: str = key("", "'N,M': N RandAugment ops an image at "
                         "magnitude M of 10, after the resize; '': none",
                         before=AS_DEFAULT)
  eval_crop_fraction: float = key(
      1.0, "1: evaluation resizes to image_size; f < 1: to image_size / f, "
      "then the central crop")
  naflex: NaFlex = section(NaFlex, "NaFlex: every image at its own aspect "
                           "ratio, as a sequence of patches")
  broken_images: str = key(
      "skip", "images that do not decode: skip (left out, counted, named) "
      "or refuse (the run stops at the first)", changeable=True,
      before=AS_DEFAULT)
  objective: str = key(
      "classification", "what the run learns: classification, mae, dino, "
      "image_text (SigLIP) or linear_probe (a head on a frozen encoder)",
      choices=("classification", "mae", "dino", "image_text",
               "linear_probe"),
      before=AS_DEFAULT)
  model: Model = section(Model, "the model: name and overrides")
  loss: str = key("softmax", "softmax or sigmoid cross-entropy",
                  before=AS_DEFAULT)
  label_smoothing: float = key(0.0, "label smoothing (0: off)",
                               at_least=0.0, below=1.0, before=AS_DEFAULT)
  random_erasing: float = key(
      0.0, "the probability that a training image has a box replaced by "
      "noise (timm's RandomErasing; training/targets.py)", at_least=0.0,
      at_most=1.0, before=AS_DEFAULT)
  mixup: Mix = section(lambda: Mix(alpha=0.2), "Mixup of whole batches")
  cutmix: Mix = section(Mix, "CutMix of whole batches")
  batch_size: int = key(0, "the global batch", at_least=1)
  accum_steps: int = key(1, "micro-batches a step's gradients are averaged "
                         "over (where a batch does not fit)", at_least=1,
                         changeable=True)
  total_steps: int = key(0, "training steps", at_least=1, changeable=True)
  optimizer: Optimizer = section(Optimizer, "the optimizer and its schedule")
  init_from: str = key("", "a checkpoint: .npz, HF directory, timm "
                       ".safetensors, workdir DIR[:STEP], hf://ORG/NAME[@REV] "
                       "(recorded at its commit)")
  polyak_decay: float = key(0.0, "the decay of a Polyak average of the "
                            "params (0: none)", at_least=0.0, below=1.0)
  distill: Distill = section(Distill, "distillation from a teacher")
  mae: MAE = section(MAE, "masked autoencoders' pre-training")
  dino: DINO = section(DINO, "self-distillation's pre-training")
  image_text: ImageText = section(ImageText, "image-text pre-training")
  mesh: Mesh = section(Mesh, "the device mesh", changeable=True)
  seed: int = key(0, "seeds the init, the data's order, the augmentations "
                  "and dropout")
  profile_steps: str = key(
      "", "'START,COUNT': a trace of those steps on process 0 for "
      "TensorBoard's profile tab; '': none", changeable=True,
      before=AS_DEFAULT)
  log_every: int = key(100, "steps between rows of training metrics",
                       at_least=1, changeable=True)
  evaluators: dict = key(
      {"test": {"kind": "accuracy", "every": 1000, "split": "test"}},
      "name -> kind, every (steps; 0: never) and the kind's settings "
      "(training/evaluators/)", changeable=True)
  checkpoint_every: int = key(1000, "steps between checkpoints",
                              at_least=1, changeable=True)
  keep_checkpoints: int = key(3, "the newest checkpoints kept", at_least=1,
                              changeable=True)
  wait_for_lock: bool = key(
      True, "held by another host's run: wait for its lease to lapse, "
      "taking it unless renewed; False: refuse", changeable=True,
      before=AS_DEFAULT)


def defaults():
  """Every key at its default, as the ConfigDict a config file starts
  from; an unset key (None) is a placeholder of its type."""
  return _as_config_dict(Settings())


def _as_config_dict(values):
  config = ml_collections.ConfigDict()
  for field in dataclasses.fields(values):
    value = getattr(values, field.name)
    if dataclasses.is_dataclass(value):
      config[field.name] = _as_config_dict(value)
    elif value is None:
      config[field.name] = ml_collections.config_dict.placeholder(
          _optional_type(field.type))
    else:
      config[field.name] = value
  return config


def _optional_type(annotation):
  (kind,) = [t for t in annotation.__args__ if t is not type(None)]
  return kind


def of(config):
  """The Settings of `config` (a ConfigDict of every key), each bounded
  value checked: a ConfigError names the first out of bounds, or a key
  that a config file added and no field reads (an evaluator's settings
  are the `evaluators` dict's, checked by their kind)."""
  return _section(Settings(), config, "")


def _section(defaults, config, prefix):
  """`defaults` (a section's dataclass) with the values `config` sets."""
  unknown = sorted(set(config) - {field.name for field in
                                  dataclasses.fields(defaults)})
  if unknown:
    section = f"config.{prefix[:-1]}" if prefix else "the config"
    raise errors.ConfigError(f"{section} has no key "
                             f"{unknown[0]!r} (its keys: "
                             "vit_jax/runs/settings.py)")
  values = {}
  for field in dataclasses.fields(defaults):
    value = getattr(defaults, field.name)
    if dataclasses.is_dataclass(value):
      value = _section(value, config[field.name], f"{prefix}{field.name}.")
    elif field.name in config:
      value = config[field.name]
      _check(prefix + field.name, value, field.metadata)
      if isinstance(value, ml_collections.ConfigDict):
        value = types.MappingProxyType(value.to_dict())
    values[field.name] = value
  return type(defaults)(**values)


def _check(name, value, metadata):
  problem = options.problem(f"config.{name}", value, metadata)
  if problem:
    raise errors.ConfigError(problem)


def described(section=None):
  """{dotted key: its description (None where a field has none)} of every
  key of `section` (default: all of Settings), a section's before its own
  keys."""
  return {name: field.metadata.get("description")
          for name, field, _ in _fields(section or Settings())}


def changeable_keys():
  """fnmatch patterns of the dotted keys a restart may change: a key, or
  "SECTION.*" for a section or dict-valued key of which any part may."""
  return tuple(
      name + (".*" if dataclasses.is_dataclass(value) or
              isinstance(value, dict) else "")
      for name, field, value in _fields(Settings())
      if field.metadata.get("changeable"))


def resolved_keys():
  """{dotted key: its default, as JSON holds it} of the keys whose `before`
  is RESOLVED: a run recorded without one holds the default, and the
  restart resolves it (training/resolve.py)."""
  return {name: as_json(value) for name, field, value in _fields(Settings())
          if field.metadata.get("before") is RESOLVED}


def as_json(values):
  """`values` (Settings, a section or a value) as config.json holds it:
  dicts, lists and JSON's scalars."""
  if dataclasses.is_dataclass(values):
    return {field.name: as_json(getattr(values, field.name))
            for field in dataclasses.fields(values)}
  if isinstance(values, (dict, types.MappingProxyType)):
    return {name: as_json(value) for name, value in values.items()}
  if isinstance(values, (list, tuple)):
    return [as_json(value) for value in values]
  return values


def from_record(recorded, where):
  """The Settings that a run's recorded config (`recorded`, a dict read
  from the file `where`) holds. A key added since the run started takes what the run did
  without it (its `before`); an unset key and a RESOLVED one, its default
  (a restart resolves it)."""
  return _recorded(Settings(), recorded, "", where)


def _recorded(defaults, recorded, prefix, where):
  if not isinstance(recorded, dict):
    raise errors.InputError(f"{where} records {prefix[:-1] or 'the config'} "
                            f"as {recorded!r}, not a section of keys")
  unknown = sorted(set(recorded) - {field.name for field in
                                    dataclasses.fields(defaults)})
  if unknown:
    raise errors.InputError(
        f"{where} records the key {prefix}{unknown[0]}, which this "
        "vit_jax does not know: it was written by another version")
  values = {}
  for field in dataclasses.fields(defaults):
    default = getattr(defaults, field.name)
    if dataclasses.is_dataclass(default):
      value = _recorded(default, recorded.get(field.name, {}),
                        f"{prefix}{field.name}.", where)
    elif field.name in recorded:
      value = _typed(recorded[field.name])
    else:
      before = field.metadata.get("before", ORIGINAL)
      value = (default if before in (ORIGINAL, AS_DEFAULT, RESOLVED)
               else before)
    values[field.name] = value
  return type(defaults)(**values)


def _typed(value):
  """A value as JSON held it, in the form `of` gives: tuples for lists (a
  hybrid's stages, lr_mults), a read-only dict for a dict."""
  if isinstance(value, list):
    return tuple(_typed(item) for item in value)
  if isinstance(value, dict):
    return types.MappingProxyType(value)
  return value


def _fields(section, prefix=""):
  """(dotted key, field, default) of every field of `section`, a nested
  section's before its own."""
  for field in dataclasses.fields(section):
    value = getattr(section, field.name)
    yield prefix + field.name, field, value
    if dataclasses.is_dataclass(value):
      yield from _fields(value, f"{prefix}{field.name}.")
