"""A run resolved once: its config checked and completed, its mesh, its data.

`run(config, workdir)` is where a training run is put together, before
anything is compiled or written. The config (an ml-collections ConfigDict)
becomes typed Settings first, and from then on the Settings are the run's
only config:

  1. every value of the config checked: a user's slip is one ConfigError
     naming the key;
  2. the workdir (vit_jax/runs/workdir.py, local or gs://) and the run it
     already holds, if any (the Settings its config.json records);
  3. the model's source options (LayerNorm epsilon, GELU, final norm, the
     parts of the architecture a checkpoint fixes): as the run recorded
     them, else its init_from's (read, and fetched from the hub, only
     now), else the release's (weights/pretrained.py, `with_source`);
  4. the mesh over this process's devices;
  5. the datasets it reads, each looked up once (data/sources.py), with the
     evaluators' splits and the broken-image policy checked against them;
     a folder's files compared with the run's record before it is
     prepared;
  6. the model and the optimizer, built once for the dataset's classes
     (step.parts) with its objective (training/objectives/), and what the
     objective reads once (a distilling run's teacher), checked against the mesh and the image size; an
     attention and a remat policy of "auto" made concrete (fitting.py: on
     TPUs the step is compiled to choose the remat policy that fits);
  7. the input shares the training split is read in: as recorded, else as
     set, else chosen for the data-parallel size (data/shares.py);
  8. what differs from the workdir's recorded Settings: a change that a
     restart may not make is refused here (runs/store.py).

The training loop, the evaluators and the VTAB suite take the `Run`;
`vit_jax.plan` takes `program`'s part of it (no data, no
checkpoint, no workdir).
"""

import dataclasses
from typing import Any, NamedTuple

from jax.sharding import Mesh

from vit_jax import errors, paths, sharding
from vit_jax.data import packing, preprocess, shares, sources
from vit_jax.models import naflex as naflex_lib
from vit_jax.models.config import ViTConfig
from vit_jax.runs import settings, store, workdir as workdir_lib
from vit_jax.training import (
  distill,
  evaluators,
  fitting,
  objectives,
  profiling,
  step,
)
from vit_jax.weights import pretrained


class Checked(NamedTuple):
  """What the config's values give, each parsed once (`check_values`)."""
  settings: settings.Settings  # the config's keys, typed
  augmentation: preprocess.Augmentation  # what training does to an image
  evaluations: tuple  # the evaluators.Evaluation of each evaluator run


@dataclasses.dataclass(frozen=True)
class Run:
  """What every part of a training run is told."""
  settings: settings.Settings  # the config's keys, typed, resolved (what
  #                               config.json records)
  augmentation: preprocess.Augmentation  # what training does to an image
  evaluations: tuple  # the evaluators.Evaluation of each evaluator run
  workdir: workdir_lib.Workdir
  mesh: Mesh
  sources: sources.Sources  # its datasets, each looked up once
  changes: dict  # {key: (recorded, new)} that a restart may make
  parts: step.Parts  # the model and the optimizer, built once

  @property
  def source(self):
    """The training dataset's Source."""
    return self.sources()

  @property
  def num_classes(self):
    return self.source.num_classes

  @property
  def naflex(self):
    """How its images are cut into patches where config.naflex sets a
    budget (models.naflex.Budget), else None."""
    return naflex_lib.budget_of(self.settings.naflex.max_num_patches,
                                self.parts.model,
                                self.settings.naflex.packing)

  @property
  def packing(self):
    """How it packs its training images (data/packing.py), or None."""
    return packing.Packing.of(self.settings.naflex)


def run(config, workdir, devices=None):
  """The Run of `config` (a ConfigDict) in `workdir` (a path or URL) over
  `devices` (default: all)."""
  checked = check_values(settings.of(config))
  paths.check_reachable(workdir, "--workdir", writes=True)
  objective = objectives.of(checked.settings)
  for value, flag in ((checked.settings.data_dir, "config.data_dir"),
                      (checked.settings.init_from, "config.init_from"),
                      *objective.paths(checked.settings)):
    paths.check_reachable(value, flag)
  workdir = workdir_lib.Workdir(workdir)
  recorded = workdir.read_config() if workdir.has_run() else None
  checked = checked._replace(settings=objective.pinned(
      pretrained.with_source(checked.settings, recorded), recorded))
  keys = checked.settings
  check_rope(keys)  # Its rope is final now: the config's or the source's.
  mesh = sharding.make_mesh(keys.mesh, devices)
  data = sources.Sources(keys.dataset, keys.data_dir)
  keys = dataclasses.replace(
      keys, folder_contents=folder_contents(keys, recorded, data, workdir))
  check_data(checked, data)
  # Before the objective is built: its recipe pairs Mixup's partners within
  # input shares (targets.py), which the batch must divide over the mesh.
  check_batch(keys.batch_size, keys.accum_steps, mesh)
  keys = dataclasses.replace(
      keys, input_shares=input_shares(keys, recorded, mesh, data))
  checked = checked._replace(settings=keys)
  fitted = fit(checked, mesh, data().num_classes, objective.load(keys))
  if fitted.program is not None and fitted.compiled is None:
    raise errors.ConfigError(
        "config.model.remat_policy='auto': the step does not fit the "
        f"devices' memory with any remat policy ({fitted.tried_text()}); "
        "`python -m vit_jax.plan` says what else would make it fit")
  keys = dataclasses.replace(keys, model=fitted.settings.model)
  changes = store.differences_allowed(keys, recorded, workdir)
  return Run(keys, checked.augmentation, checked.evaluations, workdir, mesh,
             data, changes, fitted.parts)


class Fitted(NamedTuple):
  """A config's program with its "auto" settings made concrete (`fit`)."""
  settings: settings.Settings  # remat_policy and attention concrete
  mesh: Mesh
  parts: step.Parts
  program: Any  # step.Program, where choosing compiled it; else None
  compiled: Any  # the compiled train step, where one fit; else None
  tried: tuple  # ((remat policy, HBM bytes it needed), ...) that did not
  seconds: float  # compiling to choose

  def tried_text(self):
    return fitting.describe_tried(self.tried)


def fit(checked, mesh, num_classes, frozen=None):
  """The Fitted program of `checked` over `mesh`: its model and optimizer
  built for `num_classes`, with its objective's `frozen` inputs (a
  distill.Teacher), its "auto" settings
  made concrete for the devices (fitting.py): the attention, and the remat
  policy, the first of fitting.REMAT_BY_MEMORY whose step fits, compiled
  in turn on TPUs."""
  distill.check_classes(frozen, num_classes)
  device = mesh.devices.flat[0]
  policy = checked.settings.model.remat_policy
  attention = fitting.attention(checked.settings.model, device)
  choices = fitting.policies(policy, device)
  tried, seconds = [], 0.0
  for choice in choices:
    keys = checked.settings
    keys = dataclasses.replace(keys, model=dataclasses.replace(
        keys.model, remat_policy=choice, attention=attention))
    built = check_program(checked._replace(settings=keys), mesh, num_classes,
                          frozen)
    if len(choices) == 1:  # Nothing to choose: nothing compiled here.
      return Fitted(keys, mesh, built, None, None, (), 0.0)
    program = step.build(keys, mesh, built)
    compiled, needed, took = fitting.compile_step(program, fitting.batch_shapes(
        keys, built.objective, program.batch_sharding))
    seconds += took
    if compiled is not None:
      break
    tried.append((choice, needed))
  return Fitted(keys, mesh, built, program, compiled, tuple(tried), seconds)


def program(keys, devices=None, num_classes=1, frozen=None):
  """The Fitted program of the Settings `keys` over `devices` for
  `num_classes`, with every check that compiling the train step needs; no
  data or checkpoint is read but its objective's frozen inputs (a
  distilling run's teacher), unless given as `frozen` (read already for the
  same settings) (vit_jax.plan stops
  here: what a run computes, its function options, costs the same)."""
  checked = check_values(keys)
  mesh = sharding.make_mesh(checked.settings.mesh, devices)
  return fit(checked, mesh, num_classes,
             frozen or objectives.of(keys).load(checked.settings))


def check_values(keys):
  """Every value of the Settings `keys` (settings.of's, which checked
  each bound) that can be checked on its own, each naming its key; what
  they give (Checked)."""
  if not keys.dataset:
    raise errors.ConfigError("config.dataset is empty: name a TFDS dataset, "
                             "'digits', folder:PATH or captions:PATH")
  try:
    preprocess.check_crop_fraction(keys.eval_crop_fraction)
    augmentation = preprocess.augmentation(keys.augment, keys.randaugment)
  except errors.InputError as e:  # Its key is one of config's.
    raise errors.ConfigError.of(e, "config") from e
  objectives.of(keys).check(keys)
  check_packing(keys.naflex)
  check_rope(keys)
  profiling.steps(keys.profile_steps)  # A ConfigError names the key.
  return Checked(keys, augmentation, evaluators.enabled(keys))


# The config.model keys that only a model with RoPE (model.rope) reads.
ROPE_ONLY = ("rope_theta", "rope_shift", "rope_jitter", "rope_rescale")


def check_rope(keys):
  """A ConfigError naming a ROPE_ONLY key set where the model has no
  RoPE, which would record it and train without it. A model whose rope
  init_from says (unset: None) is checked once pretrained.with_source has
  read it; a key at its default (unset, or the model's) passes."""
  model = keys.model
  if model.rope or (model.rope is None and keys.init_from):
    return
  for name in ROPE_ONLY:
    value = getattr(model, name)
    if value not in (getattr(settings.Model(), name),
                     ViTConfig.__dataclass_fields__[name].default):
      raise errors.ConfigError(
          f"config.model.{name}={value!r} applies to rotary position "
          "embeddings, which the model does not have (config.model.rope="
          f"{model.rope or ''!r}"
          f"{', the config or init_from says' if keys.init_from else ''}): "
          "set config.model.rope ('axial', 'index' or 'mixed'), or leave "
          f"{name} unset")


# The config.naflex keys that only a packed run reads.
PACKING_ONLY = ("min_side", "max_side", "token_drop", "token_drop_sampled")


def check_packing(naflex):
  """config.naflex's packing keys (data/packing.py), each ConfigError
  naming its key."""
  if not naflex.packing:
    for name in PACKING_ONLY:
      if getattr(naflex, name) != getattr(settings.NaFlex(), name):
        raise errors.ConfigError(
            f"config.naflex.{name} applies to packed sequences: set "
            "config.naflex.packing=True, or leave it unset")
    return
  packing.Packing.of(naflex).check()


def check_program(checked, mesh, num_classes, frozen=None):
  """The objective, its model and the optimizer (step.Parts, with
  `frozen`), built here once, and the checks that need them and the
  mesh."""
  keys = checked.settings
  built = step.parts(keys, num_classes, frozen)
  model = built.model
  built.objective.check_run(keys, checked.evaluations)
  per_step = check_batch(keys.batch_size, keys.accum_steps, mesh)
  if keys.image_size % model.token_stride:
    raise errors.ConfigError(f"config.model {model.describe_patch()} does not "
                             f"divide config.image_size={keys.image_size}")
  if keys.naflex.max_num_patches:
    check_naflex(keys, model, keys.batch_size // per_step, mesh)
  return built


def check_batch(batch_size, accum_steps, mesh):
  """A ConfigError unless config.batch_size divides over the mesh's
  data-parallel devices (data x fsdp) times accum_steps; returns that
  product."""
  data_parallel = sharding.data_parallel_size(mesh)
  per_step = data_parallel * accum_steps
  if batch_size % per_step:
    raise errors.ConfigError(
        f"config.batch_size={batch_size} is not divisible by the "
        f"{data_parallel} data-parallel devices (mesh data={mesh.shape['data']}"
        f" x fsdp={mesh.shape['fsdp']}) times accum_steps={accum_steps}")
  return per_step


def check_naflex(keys, model, images_per_device, mesh):
  """What a NaFlex run cannot do, each a ConfigError naming its key:
  also a budget whose attention weights, which the einsum keeps, cannot
  fit one device for its `images_per_device` in one layer."""
  name = "config.naflex.max_num_patches"
  device = mesh.devices.flat[0]
  if fitting.attention(keys.model, device) == "einsum":
    try:
      naflex_lib.check_budget(
          model.config, keys.naflex.max_num_patches, name, images_per_device,
          "a smaller budget, fewer images per device (config.batch_size, "
          "config.accum_steps) or model.attention 'fused' or 'splash'",
          device)
    except errors.InputError as e:
      raise errors.ConfigError.of(e) from e
  if model.config.resnet_stages is not None:
    raise errors.ConfigError(f"{name}: a hybrid's ResNet stem reads whole "
                             "square images, not patches")
  if keys.model.mpp:
    raise errors.ConfigError(f"{name}: masked patch prediction trains on "
                             "square images; set config.model.mpp=False")
  if keys.mixup.prob or keys.cutmix.prob:
    raise errors.ConfigError(f"{name}: Mixup and CutMix blend whole square "
                             "images, and NaFlex images differ in shape; "
                             "set config.mixup.prob and config.cutmix.prob "
                             "to 0")
  if keys.randaugment:
    raise errors.ConfigError(f"{name}: RandAugment runs at the square "
                             "image_size; set config.randaugment=''")


def check_data(checked, data):
  """The checks that read the datasets' descriptions: the training split,
  the broken-image policy, the evaluators' datasets and splits. What they
  find is the config's to fix (its dataset, data_dir or splits): a
  ConfigError."""
  keys = checked.settings
  try:
    labels = objectives.of(keys).reads_labels(keys)
    if labels and data().multi_label and keys.loss != "sigmoid":
      raise errors.ConfigError(
          f"{keys.dataset} is multi-label (each image a set of classes): "
          f"train it with config.loss='sigmoid', one binary problem a class")
    data().num_examples(keys.train_split)
    if objectives.of(keys).reads_captions(keys) and data().captions is None:
      raise errors.ConfigError(
          f"{keys.dataset} has no captions (a \"captions\" or \"caption\" "
          "feature; a captions:PATH folder) to train two towers on: "
          "caption its labels with config.image_text.templates and "
          "class_names")
    if data().num_classes < 2 and labels:
      raise errors.ConfigError(
          f"{keys.dataset} has {data().num_classes} class: a classifier "
          "learns nothing from one (its loss is 0 from the start); a folder "
          "dataset needs a folder of images per class, two at least")
    sources.check_broken_images(data(), keys.broken_images)
    evaluators.check(checked.evaluations, data)
  except errors.ConfigError:
    raise
  except errors.InputError as e:
    raise errors.ConfigError.of(e) from e


def folder_contents(keys, recorded, data, workdir):
  """The run's folder_contents: for a folder dataset, the name of the copy
  its images are prepared in (a fingerprint of their paths, sizes and
  times), else "".

  A restart on a folder whose files changed since the run recorded it is
  refused, naming them: its slices (train[:80%], train[80%:]) would shift,
  and test images could become training images. Setting
  config.folder_contents to the folder's name now allows it, and the
  change is recorded in config_changes.jsonl (runs/store.py).
  """
  found = data.folder_config()
  wanted = keys.folder_contents
  if found is None:
    if wanted:
      raise errors.ConfigError(
          f"config.folder_contents is for folder datasets, but "
          f"config.dataset is {keys.dataset!r}: leave it unset")
    return ""
  if wanted and wanted != found.name:
    raise errors.ConfigError(
        f"config.folder_contents={wanted!r}, but the folder {found.root} "
        f"holds {found.name!r} now")
  before = recorded.folder_contents if recorded else None
  if before and before != found.name and not wanted:
    changed = data.folder_changes(before)
    listed = (f" ({len(changed)}: {', '.join(changed[:3])}"
              f"{', ...' if len(changed) > 3 else ''})" if changed else "")
    raise errors.ConfigError(
        f"the files of the folder {found.root} changed since the run in "
        f"{workdir} started{listed}: its splits and slices would no longer "
        f"hold the same images. Put them back, use a new --workdir, or "
        f"resume on the folder as it is with "
        f"--config.folder_contents={found.name} (recorded in "
        f"config_changes.jsonl)")
  return found.name


def input_shares(keys, recorded, mesh, data):
  """The run's input_shares: as the run `recorded` it, else as the config
  sets it, else `shares.default`; refused when the mesh's data-parallel
  devices cannot split it."""
  data_parallel = sharding.data_parallel_size(mesh)
  count = keys.input_shares
  if count is None and recorded is not None:
    # As recorded (a run recorded before there were input shares read one
    # per data-parallel device); a set value that differs is refused by
    # the run store.
    count = recorded.input_shares or data_parallel
  elif count is None:
    count = shares.default(keys.batch_size,
                           data().num_examples(keys.train_split),
                           data_parallel)
  if count % data_parallel or keys.batch_size % count:
    raise errors.ConfigError(
        f"config.input_shares={count} cannot be read by {data_parallel} "
        f"data-parallel devices (mesh {sharding.describe_mesh(mesh.shape)}) "
        f"in blocks of config.batch_size={keys.batch_size}: it must be a "
        f"multiple of data x fsdp and divide the batch. A resumed run keeps "
        f"the count it started with: resume it on a mesh whose data x fsdp "
        f"divides {count}")
  return count
