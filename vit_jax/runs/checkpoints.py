"""A run's train state in orbax checkpoints, under WORKDIR/checkpoints.

Orbax writes each step to a temporary directory and renames it when
complete, so a crash mid-save never leaves a half-written step in place,
and arrays are read back without pickle. A save runs in the background; a
failure of the storage under it stops the run with one message.
"""

import functools

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from vit_jax import errors, paths
from vit_jax.runs import failures, fingerprints

# Orbax splits the writing of a replicated array among its replicas. For a
# small array that saves nothing, and every (shape, device) pair costs a
# compiled slicing program (docs/runs.md, "Saving"). Below 1 MiB per slice,
# replica 0 writes it alone.
MIN_BYTES_PER_REPLICA_SLICE = 1 << 20


@functools.cache
def _register_array_handler():
  """Once per process, when the first manager is made: importing this module
  changes nothing in orbax."""
  # Overriding is the point; orbax would log a warning for it in every run.
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(
            min_slice_bytes_for_replica_parallel=MIN_BYTES_PER_REPLICA_SLICE),
        override=True)
  finally:
    logging.set_verbosity(verbosity)


def manager(directory, keep, read_only=False, preserve=()):
  """An orbax CheckpointManager keeping the newest `keep` steps, and the
  steps of `preserve` besides. A save that a crash or a full disk left
  half-written is deleted when the next run makes its manager (the run
  that holds the workdir, runs/lock.py). `read_only`: one that writes and
  deletes nothing, to read a finished run (also from a read-only copy of
  its workdir)."""
  _register_array_handler()
  if read_only:
    options = ocp.CheckpointManagerOptions(read_only=True, create=False)
  else:
    policies = ocp.checkpoint_managers
    kept = policies.LatestN(keep)
    if preserve:
      kept = policies.AnyPreservationPolicy(
          [kept, policies.CustomSteps(list(preserve))])
    options = ocp.CheckpointManagerOptions(preservation_policy=kept,
                                           create=True,
                                           cleanup_tmp_directories=True)
  # Orbax wants a local folder absolute; a gs:// one stays as it is.
  return ocp.CheckpointManager(paths.shown(directory), options=options)


def params_reader(directory):
  """A manager that writes nothing and reads parts of a state
  (`restore_params`), to take a run's params without its optimizer's."""
  return ocp.CheckpointManager(
      paths.shown(directory),
      item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                     "progress": ocp.JsonCheckpointHandler()},
      options=ocp.CheckpointManagerOptions(read_only=True, create=False))


def restore_newest_whole_params(reader, step=None):
  """(step, params, "Polyak average" or "params") of the newest checkpoint
  (or of `step`) that `reader` (`params_reader`) reads whole and unaltered,
  as numpy on the host: the Polyak average when the run kept one, else its
  params. What the read-only tools (export, predict, figures, init_from)
  take from a workdir.

  A checkpoint that fails restore_newest_whole's checks (commit markers,
  arrays that read, their fingerprints) is named in a warning and the one
  before it read; nothing is renamed (the workdir is the run's). When none
  is whole, or `step` is not, an InputError names each and what failed."""
  steps = sorted(reader.all_steps(), reverse=True)
  if step is not None:
    steps = [step]
  failed = []
  for candidate in steps:
    params, what, problem = _read_params_verified(reader, candidate)
    if problem is None:
      return candidate, params, what
    if step is None:
      logging.warning("The checkpoint of step %d in %s %s: reading the one "
                      "before it", candidate, reader.directory, problem)
    failed.append(f"step {candidate} {problem}")
  raise errors.InputError(
      f"no checkpoint in {reader.directory} reads whole: {'; '.join(failed)}")


def _read_params_verified(reader, step):
  """(params, what, None) of `step`, or (None, None, what is wrong)."""
  directory = epath.Path(reader.directory) / str(step)
  missing = [m for m in COMMIT_MARKERS if not (directory / m).exists()]
  if missing:
    return None, None, f"lacks its commit markers ({', '.join(missing)})"
  try:
    saved = reader.item_metadata(step)["state"].tree
    name = "polyak" if saved.get("polyak") else "params"
    shapes = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype),
                          saved[name])
    # As numpy: the saved sharding belongs to another mesh.
    restored = reader.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
            item={name: shapes}, partial_restore=True,
            restore_args={name: jax.tree.map(
                lambda _: ocp.RestoreArgs(restore_type=np.ndarray), shapes)}),
        progress=ocp.args.JsonRestore()))
  except Exception as e:  # pylint: disable=broad-except
    return None, None, f"does not read ({_first_line(e)})"
  params = restored.state[name]
  # The state's fingerprints are keyed by its paths (".params['x']...").
  prefix = f".{name}"
  expected = {key[len(prefix):]: value for key, value in
              restored.progress.get("fingerprints", {}).items()
              if key.startswith(prefix + "[")}
  if expected:  # Checkpoints saved before they existed have none.
    changed = fingerprints.mismatches(expected, params)
    if changed:
      return None, None, (f"has arrays that differ from those saved "
                          f"({name}{', '.join(changed[:3])}"
                          f"{', ...' if len(changed) > 3 else ''})")
  return params, "Polyak average" if name == "polyak" else "params", None


def _first_line(e):
  """The first line of the exception that `e` goes back to: orbax wraps
  tensorstore's error (which names the array and what is wrong with its
  bytes) in one that prints a Python method's repr and pages of spec."""
  while e.__cause__ is not None or e.__context__ is not None:
    e = e.__cause__ or e.__context__
  text = str(e).strip()
  return text.splitlines()[0][:300] if text else type(e).__name__


def save(checkpoints, step, state, progress):
  """Starts saving `state` (a pytree of jax.Arrays) and `progress` (JSON) at
  `step`, in the background; first raises a RunError if an earlier save
  failed for want of storage."""
  # Computed where the arrays are: a few bytes an array reach the host.
  progress = {**progress, "fingerprints": fingerprints.of(state)}
  with _storage_errors(checkpoints, f"save the checkpoint of step {step}"):
    checkpoints.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        progress=ocp.args.JsonSave(progress)))


def check_saves(checkpoints):
  """A RunError now if a background save has failed for want of storage
  (a full disk, no permission, a storage service error): the loop calls it
  every step, so a run stops within seconds of a failed save, not at the
  next one."""
  with _storage_errors(checkpoints, "save a checkpoint"):
    checkpoints.check_for_errors()  # The arrays' writing.
    if not checkpoints.is_saving_in_progress():
      # Returns at once, raising what the finished save's last part (its
      # metadata and the rename into place) failed with, if anything.
      checkpoints.wait_until_finished()


def finish(checkpoints):
  """Waits for the save under way (the run resumes from it rather than an
  older one); a RunError if it fails for want of storage."""
  with _storage_errors(checkpoints, "save a checkpoint"):
    checkpoints.wait_until_finished()


def complete_steps(directory):
  """The steps whose checkpoints in `directory` are complete (renamed into
  place; a save under way or cut short has a temporary name)."""
  path = epath.Path(directory)
  if not path.exists():
    return []
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())


def _storage_errors(checkpoints, what):
  def kept():
    steps = complete_steps(checkpoints.directory)
    return (f"the checkpoint of step {steps[-1]} is complete" if steps
            else "no checkpoint is complete yet")
  return failures.stops_on_failure(f"{what} in {checkpoints.directory}", kept)


# What orbax writes after a step's arrays: a step directory without them
# was never finished, or has lost them since.
COMMIT_MARKERS = ("_CHECKPOINT_METADATA", "state/_METADATA")
# A checkpoint that fails its checks is renamed to this (never deleted),
# a name orbax does not take for a step.
SET_ASIDE = "{step}.corrupt"


def restore_if_whole(checkpoints, step, state_shapes):
  """(state, progress) of `step`, or None when it fails the checks of
  restore_newest_whole (which then names and sets it aside)."""
  restored, problem = _read_verified(checkpoints, step, state_shapes)
  if _agreed(problem) is not None:
    return None
  return restored.state, restored.progress


def restore_newest_whole(checkpoints, state_shapes):
  """(state, progress) of the newest checkpoint that is whole and unaltered,
  or None when there is none at all.

  `state_shapes` holds jax.ShapeDtypeStructs with shardings: each array is
  read straight into its shards on the current mesh. A checkpoint whose
  commit markers are missing, whose arrays do not read, or whose arrays'
  fingerprints differ from those saved with them is named in one warning,
  renamed aside (SET_ASIDE) and the next older one tried; the processes of
  a pod agree on each verdict. When every checkpoint fails, a RunError
  names each and what failed.
  """
  steps = sorted(checkpoints.all_steps(), reverse=True)
  if steps:
    _refuse_another_model(checkpoints.directory, steps[0], state_shapes)
  failed = []
  for step in steps:
    restored, problem = _read_verified(checkpoints, step, state_shapes)
    problem = _agreed(problem)
    if problem is None:
      if failed:
        checkpoints.reload()  # It still lists the steps set aside.
      return restored.state, restored.progress
    aside = _set_aside(checkpoints.directory, step)
    logging.warning("The checkpoint of step %d %s: set aside as %s; trying "
                    "the one before it", step, problem, aside)
    failed.append(f"step {step} {problem}")
  if failed:
    raise errors.RunError(
        f"no checkpoint in {checkpoints.directory} can be resumed from: "
        f"{'; '.join(failed)}. Each was renamed *.corrupt, not deleted; "
        "run the same command again to start the run afresh")
  return None


def _refuse_another_model(directory, step, state_shapes):
  """A ConfigError, naming the arrays, when the checkpoint of `step` holds
  a state of other names or shapes than the config's (its model's params,
  or its optimizer's state): a config mismatch (config.json lost, or
  edited), not a damaged checkpoint to set aside. A checkpoint whose
  description does not read is left to the checks of
  restore_newest_whole."""
  reader = params_reader(directory)
  try:
    saved = reader.item_metadata(step)["state"].tree
  except Exception:  # pylint: disable=broad-except
    return
  finally:
    reader.close()
  saved, wanted = _shapes(saved), _shapes(state_shapes)
  # The params first: a model of other sizes changes its optimizer's
  # moments too.
  keys = sorted(saved.keys() | wanted.keys(),
                key=lambda key: (not key.startswith("params/"), key))
  differ = [f"{key}: saved {saved.get(key, 'absent')}, config "
            f"{wanted.get(key, 'absent')}"
            for key in keys if saved.get(key) != wanted.get(key)]
  if differ:
    raise errors.ConfigError(
        f"the checkpoints in {directory} hold another model or optimizer "
        f"than the config's ({len(differ)} arrays differ: "
        f"{'; '.join(differ[:3])}{'; ...' if len(differ) > 3 else ''}); "
        "they are left as they were. Resume with the config the run was "
        "started with, or use a new --workdir")


def _shapes(tree):
  """{"params/Transformer/...": shape} of a state's arrays, alike for
  orbax's description of a saved state (dicts and lists) and for the
  config's (a TrainState of optax's named tuples)."""
  def name(entry):
    for field in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey
      if hasattr(entry, field):
        return str(getattr(entry, field))
    return str(entry)
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {"/".join(name(entry) for entry in path): tuple(leaf.shape)
          for path, leaf in leaves if hasattr(leaf, "shape")}


def _read_verified(checkpoints, step, state_shapes):
  """(what orbax restored, None), or (None, what is wrong with it)."""
  directory = epath.Path(checkpoints.directory) / str(step)
  missing = [m for m in COMMIT_MARKERS if not (directory / m).exists()]
  if missing:
    return None, f"lacks its commit markers ({', '.join(missing)})"
  try:
    restored = checkpoints.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(state_shapes),
        progress=ocp.args.JsonRestore()))
  except Exception as e:  # pylint: disable=broad-except
    # Any failure to read what was written is this checkpoint's.
    return None, f"does not read ({_first_line(e)})"
  expected = restored.progress.get("fingerprints")
  if expected is not None:  # Checkpoints saved before they existed: none.
    changed = fingerprints.mismatches(expected, restored.state)
    if changed:
      return None, (f"has arrays that differ from those saved "
                    f"({', '.join(changed[:3])}"
                    f"{', ...' if len(changed) > 3 else ''})")
  return restored, None


def _agreed(problem):
  """`problem`, or on a pod the first process's problem when any has one:
  a checkpoint is resumed from by all processes or by none."""
  if jax.process_count() == 1:
    return problem
  flags = multihost_utils.process_allgather(np.int32(problem is not None))
  if not np.any(flags):
    return None
  return problem or "fails its checks on another process"


def _set_aside(directory, step):
  """Renames the checkpoint of `step` to a name orbax ignores (process 0;
  the others wait for it); returns the new path."""
  source = epath.Path(directory) / str(step)
  target = epath.Path(directory) / SET_ASIDE.format(step=step)
  number = 1
  while target.exists():  # An earlier run's set-aside step of this number.
    number += 1
    target = epath.Path(directory) / (SET_ASIDE.format(step=step) +
                                      f"-{number}")
  if jax.process_index() == 0:
    source.rename(target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"set aside checkpoint {step}")
  return target
