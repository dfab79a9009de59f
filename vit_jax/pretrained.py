"""Params to start a run from, or to export: from a run's workdir or an .npz.

`config.init_from` names either
  - an `.npz` in any layout `checkpoint.load_npz` reads, or
  - a workdir of ours, `DIR` (its newest checkpoint) or `DIR:STEP`.
Only params are taken (a run's Polyak average when it kept one); the new
run's optimizer starts fresh. Everything is read to host memory as numpy,
then `checkpoint.adapt` fits it to the new model.

`for_inference` loads the same sources as a model ready to run on images
(vit_jax.predict, vit_jax.inspect).
"""

import dataclasses
import os
import re

import flax
import flax.linen as nn
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from vit_jax import checkpoint, errors, models
from vit_jax.workdir import read_config


def parse_source(source):
  """"DIR:STEP" -> (DIR, STEP); "DIR" or "FILE.npz" -> (source, None)."""
  match = re.fullmatch(r"(.+):(\d+)", source)
  if match and not source.endswith(".npz"):
    return match.group(1), int(match.group(2))
  return source, None


def load(source):
  """(params as a numpy tree in the release layout, a line saying what)."""
  path, step = parse_source(source)
  if path.endswith(".npz"):
    if step is not None:
      raise errors.InputError(f"init_from {source!r}: an .npz has no steps")
    return checkpoint.load_npz(path), f"{path}"
  return load_run(path, step)


def load_run(workdir, step=None):
  """Params of step `step` (default: the newest) of the run in `workdir`:
  its Polyak average when it kept one, else its params."""
  directory = os.path.join(workdir, checkpoint.SUBDIR)
  manager = ocp.CheckpointManager(
      os.path.abspath(directory),
      item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                     "progress": ocp.JsonCheckpointHandler()})
  steps = manager.all_steps()
  if not steps:
    raise errors.InputError(
        f"{workdir} holds no checkpoint (looked in {directory}); "
        "init_from takes a workdir of ours or an .npz file")
  step = max(steps) if step is None else step
  if step not in steps:
    raise errors.InputError(
        f"{workdir} has no checkpoint of step {step}; it has "
        f"{sorted(steps)}")
  saved = manager.item_metadata(step)["state"].tree
  name = "polyak" if saved.get("polyak") else "params"
  shapes = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype),
                        saved[name])
  # As numpy on the host: the saved sharding belongs to another mesh.
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(
          item={name: shapes}, partial_restore=True,
          restore_args={name: jax.tree.map(
              lambda _: ocp.RestoreArgs(restore_type=np.ndarray), shapes)})))
  manager.close()
  what = "Polyak average" if name == "polyak" else "params"
  return restored.state[name], f"{workdir} step {step} ({what})"


def initial_params(source, param_shapes):
  """Loads `source` and adapts it to a model whose params have the shapes
  (jax.ShapeDtypeStructs) `param_shapes`.

  Returns a tree of numpy arrays, with the ShapeDtypeStructs of
  `param_shapes` left where the new model keeps its own initialisation (a
  new head). Raises ValueError naming the key and both shapes when the
  checkpoint cannot fit. Nothing is compiled.
  """
  try:
    params, what = load(source)
    logging.info("init_from: %s, %d params", what,
                 sum(np.size(x) for x in jax.tree.leaves(params)))
    return checkpoint.adapt(params, param_shapes)
  except (ValueError, FileNotFoundError) as e:
    raise errors.ConfigError(f"config.init_from={source!r}: {e}") from e


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
  """A model and its params, ready to run on images."""
  model: nn.Module  # float32, one module per block (no scan, no remat)
  params: dict  # numpy arrays in the release layout
  image_size: int  # the side its position embedding was trained at
  what: str  # where the params came from, for messages
  config: ml_collections.ConfigDict | None  # the run's; None for an .npz

  @property
  def crop_fraction(self):
    """How the run's evaluation resized images (1.0: plain resize)."""
    return self.config.eval_crop_fraction if self.config else 1.0

  def data(self, dataset="", data_dir=""):
    """(dataset, data_dir or None): those given, else the run's."""
    config = self.config
    return (dataset or (config.dataset if config else ""),
            data_dir or (config.data_dir if config else "") or None)


def for_inference(workdir=None, npz=None, step=None):
  """The model of a run (its checkpoint of `step`, default the newest) or of
  an .npz of any layout `checkpoint.load_npz` reads; give one of the two.

  The architecture is read from the params' shapes (`models.from_params`),
  so a released file needs no config. (An .npz whose position embedding has
  no params, "sincos2d" or "none", needs its run's workdir instead.)
  """
  if bool(workdir) == bool(npz):
    raise errors.InputError("give exactly one of a workdir and an .npz")
  if npz:
    params, what, config = checkpoint.load_npz(npz), npz, None
  else:
    config = read_config(workdir)
    params, what = load_run(workdir, step)
    # A scanned run's stacked blocks, one per layer.
    params = flax.traverse_util.unflatten_dict(checkpoint.to_release_layout(
        flax.traverse_util.flatten_dict(params, sep="/")), sep="/")
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  model, image_size = models.from_params(
      params, config.model.get("posemb") if config else None)
  image_size = image_size or config.image_size
  return Inference(model, params, image_size, what, config)
