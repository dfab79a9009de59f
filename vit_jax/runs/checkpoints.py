"""A run's train state in orbax checkpoints, under WORKDIR/checkpoints.

Orbax writes each step to a temporary directory and renames it when
complete, so a crash mid-save never leaves a half-written step in place,
and arrays are read back without pickle. A save runs in the background; a
failure of the storage under it stops the run with one message.
"""

import functools
import os

import jax
from etils import epath
import orbax.checkpoint as ocp
from absl import logging

from vit_jax.runs import storage


# Where a run keeps its orbax checkpoints, under its workdir.
SUBDIR = "checkpoints"


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


def manager(directory, keep):
  """An orbax CheckpointManager keeping the newest `keep` steps. A save that
  a crash or a full disk left half-written is deleted when the next run
  makes its manager."""
  _register_array_handler()
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           cleanup_tmp_directories=True))


def save(checkpoints, step, state, progress):
  """Starts saving `state` (a pytree of jax.Arrays) and `progress` (JSON) at
  `step`, in the background; first raises a RunError if an earlier save
  failed for want of storage."""
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
  return storage.stops_on_failure(f"{what} in {checkpoints.directory}", kept)


def restore_latest(checkpoints, state_shapes):
  """(state, progress) of the newest step, or None when there is none.

  `state_shapes` holds jax.ShapeDtypeStructs with shardings: each array is
  read straight into its shards on the current mesh.
  """
  step = checkpoints.latest_step()
  if step is None:
    return None
  restored = checkpoints.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(state_shapes),
      progress=ocp.args.JsonRestore()))
  return restored.state, restored.progress
