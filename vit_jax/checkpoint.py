"""Checkpoints: orbax train state, released `.npz` interchange, adapting trees.

Train state goes through orbax: it writes each step to a temporary directory
and renames it when complete, so a crash mid-save never leaves a corrupt
checkpoint behind, and arrays are read back without pickle.

Our params tree uses the module names of the released vit_jax files, so the
release layout is just the tree flattened with '/'. Two more layouts load:
big_vision's (modules numbered per type, position embedding at the top) and
big_vision's scanned one (one `encoderblock` whose arrays carry a leading
layer axis), each also under the `opt/target/` or `params/` prefix that
published files use; bfloat16 arrays load as float32.
"""

import contextlib
import functools
import os
import re
import zipfile

import flax
import flax.linen as nn
import jax
from etils import epath
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import scipy.ndimage
from absl import logging

from vit_jax import errors, models, storage

POSEMB_KEY = models.POSEMB_KEY
# Where a run keeps its orbax checkpoints, under its workdir.
SUBDIR = "checkpoints"

# big_vision numbers modules per type; the release counts across types.
_BIG_VISION_BLOCK_NAMES = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


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


def save_npz(params, path):
  """Writes `params` as a flat .npz in the released vit_jax layout.

  `params` may be what `model.init(...)["params"]` returns (arrays boxed in
  `nn.LogicallyPartitioned`, which are unboxed here), a FrozenDict or a plain
  dict, of numpy or jax arrays (sharded ones too, when fully addressable).
  A scanned model's stacked blocks are written one per layer.
  """
  params = flax.core.unfreeze(nn.meta.unbox(params))
  flat = unscan_blocks(flax.traverse_util.flatten_dict(params, sep="/"))
  arrays = {}
  for key, value in flat.items():
    array = np.asarray(value)
    if array.dtype.hasobject:
      raise errors.InputError(
          f"{key!r} is not an array of numbers "
          f"({type(value).__name__}); cannot save it without pickle")
    arrays[key] = array
  with open(path, "wb") as f:
    np.savez(f, **arrays)


def load_npz(path):
  """Reads a released, big_vision or scanned big_vision .npz into our tree.

  Files are read with `np.load(allow_pickle=False)`, never with pickle. The
  tree may sit under a prefix, as in published files: `opt/target/` (some of
  the original release) or `params/` (big_vision); see `to_release_layout`,
  which drops whatever else such files hold (optimizer state, step counter).
  bfloat16 arrays (stored by numpy as 2-byte void, `|V2`) load as float32,
  exactly: every bfloat16 is a float32. Any other void, structured or object
  array is refused with a ValueError naming its key.
  """
  with _open_npz(path) as npz:
    flat = {key: _read_array(npz, key, path) for key in npz.files}
  return flax.traverse_util.unflatten_dict(to_release_layout(flat), sep="/")


def npz_keys(path):
  """The keys of an .npz, without reading its arrays."""
  with _open_npz(path) as npz:
    return npz.files


@contextlib.contextmanager
def _open_npz(path):
  """The NpzFile at `path`, arrays read only when indexed; an InputError
  for anything else."""
  # epath: gs:// paths (the released files) read like local ones.
  with epath.Path(path).open("rb") as f:
    try:
      npz = np.load(f, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
      # numpy takes what is neither .npy nor .npz for a pickle.
      raise errors.InputError(f"{path} is not an .npz file of arrays (an "
                              "export of vit_jax, big_vision or timm)") from e
    if not isinstance(npz, np.lib.npyio.NpzFile):
      raise errors.InputError(f"{path} is a single .npy array, not an .npz "
                              "of named arrays")
    with npz:
      yield npz


def _read_array(npz, key, path):
  try:
    array = npz[key]
  except ValueError as e:
    if "allow_pickle" in str(e):
      raise errors.InputError(
          f"{path}: {key!r} holds pickled objects; only plain arrays are "
          "loaded, never pickle") from e
    raise
  dtype = array.dtype
  if dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
    return array.view(ml_dtypes.bfloat16).astype(np.float32)  # Exact.
  if dtype.kind in "VO":
    raise errors.InputError(
        f"{path}: {key!r} has dtype {dtype.str!r}, which is no "
        "array of numbers (only 2-byte void, numpy's bfloat16, "
        "is read)")
  return array


# Published files may store the tree under one of these; the rest of such a
# file (e.g. `opt/state/...`, `step`) is training state that is not loaded.
_PREFIXES = ("opt/target/", "params/")
# What the release and big_vision layouts have at the top of the tree.
_ROOT_LEAVES = ("cls", "pos_embedding")
_ROOT_MODULES = ("embedding/", "Transformer/", "fc_norm/", "pre_logits/",
                 "head/")


def _is_param_key(key):
  return key in _ROOT_LEAVES or key.startswith(_ROOT_MODULES)


def _strip_prefix(flat):
  """The params under a published prefix, dropping the file's other entries."""
  found = [p for p in _PREFIXES
           if any(k.startswith(p) and _is_param_key(k[len(p):]) for k in flat)]
  if not found:
    return flat
  if len(found) > 1:
    raise errors.InputError(
        f"checkpoint has params under both {found[0]!r} and "
        f"{found[1]!r}; cannot tell which tree to load")
  (prefix,) = found
  if any(_is_param_key(k) for k in flat):
    raise errors.InputError(f"checkpoint has params both under {prefix!r} and "
                            "without a prefix; cannot tell which tree to load")
  return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def to_release_layout(flat):
  """Renames a flat {'a/b/c': array} dict of any known layout to the release's.

  A tree stored under `opt/target/` or `params/` is taken from there and every
  entry outside that prefix (optimizer state such as `opt/state/...`, a
  `step` counter, ...) is dropped. Then a scanned `Transformer/encoderblock/`
  is split into one block per layer, and big_vision's per-type module names
  are renamed to the release's. A dict with no key that a known layout would
  have raises a ValueError listing the keys it saw.
  """
  params = _strip_prefix(flat)
  if not any(_is_param_key(k) for k in params):
    keys = sorted(flat)
    raise errors.InputError(
        "not a ViT checkpoint of a known layout (released vit_jax or "
        "big_vision, optionally under 'opt/target/' or 'params/'); first keys: "
        f"{keys[:10]}{' ...' if len(keys) > 10 else ''}")
  flat = unscan_blocks(params)
  if any("/MlpBlock_0/" in k for k in flat):
    flat = {_rename_big_vision_key(k): v for k, v in flat.items()}
  return flat


SCANNED_BLOCK = "Transformer/encoderblock/"
_BLOCK_KEY = re.compile(r"Transformer/encoderblock_(\d+)/(.*)")


def unscan_blocks(flat):
  """Splits the stacked `Transformer/encoderblock/...` arrays of a scanned
  model (leading axis: layer) into `encoderblock_{i}`; other keys pass.

  Leaves may be arrays or jax.ShapeDtypeStructs (a model's abstract params).
  """
  out = {}
  for key, value in flat.items():
    if not key.startswith(SCANNED_BLOCK):
      out[key] = value
      continue
    rest = key[len(SCANNED_BLOCK):]
    for i in range(value.shape[0]):
      out[f"Transformer/encoderblock_{i}/{rest}"] = (
          jax.ShapeDtypeStruct(value.shape[1:], value.dtype)
          if isinstance(value, jax.ShapeDtypeStruct) else value[i])
  return out


def scan_blocks(flat):
  """unscan_blocks' inverse: stacks `encoderblock_{i}` arrays, i = 0, 1, ..."""
  out, layers = {}, {}
  for key, value in flat.items():
    match = _BLOCK_KEY.fullmatch(key)
    if match:
      layers.setdefault(match.group(2), {})[int(match.group(1))] = value
    else:
      out[key] = value
  for rest, by_layer in layers.items():
    out[SCANNED_BLOCK + rest] = np.stack(
        [by_layer[i] for i in range(len(by_layer))])
  return out


def _rename_big_vision_key(key):
  if key == "pos_embedding":
    return POSEMB_KEY
  match = re.match(r"(Transformer/encoderblock_\d+/)([^/]+)(/.*)", key)
  if match and match.group(2) in _BIG_VISION_BLOCK_NAMES:
    prefix, module, rest = match.groups()
    return prefix + _BIG_VISION_BLOCK_NAMES[module] + rest
  return key


# What pre-training adds to a model and fine-tuning drops: the pre-logits
# layer, and masked patch prediction's mask embedding and per-patch head.
_PRETRAINING_ONLY = ("pre_logits/", "mask_embedding", "mpp_head/")


def adapt(restored, init_params):
  """Makes a restored params tree fit the model that produced `init_params`.

  - position embeddings of another grid size are interpolated (bilinear over
    the patch grid, as the released fine-tuning code does; the 2-D kind's
    row and column tables linearly along their length); the class-token
    embedding is kept as is;
  - a head of another class count (or one that sat on a pre-logits layer the
    target drops) is replaced by the target's fresh, zero-initialised head;
  - a pre-logits layer that the target has none of is dropped, and so are
    masked patch prediction's mask embedding and head (`vit_jax/mpp.py`).
  Any other mismatch raises a ValueError naming the key and both shapes.
  Each change is logged. Either tree may be scanned (stacked blocks) or not,
  and `restored` may be in any layout `to_release_layout` reads.
  `init_params` may hold jax.ShapeDtypeStructs; they come back as they are
  where the target keeps its own initialisation.
  """
  src = flax.traverse_util.flatten_dict(flax.core.unfreeze(restored), sep="/")
  src = to_release_layout(src)
  dst = flax.traverse_util.flatten_dict(flax.core.unfreeze(init_params), sep="/")
  # A scanned model is matched layer by layer, then stacked again.
  scanned = any(key.startswith(SCANNED_BLOCK) for key in dst)
  dst = unscan_blocks(dst)
  dropped_pre_logits = any(k.startswith("pre_logits/") for k in src) and not any(
      k.startswith("pre_logits/") for k in dst)

  out = {}
  for key, target in dst.items():
    if key.startswith("head/") and (
        dropped_pre_logits or key not in src or src[key].shape != target.shape):
      logging.info("adapt: %s starts afresh, %s (checkpoint: %s)", key,
                   tuple(target.shape), tuple(np.shape(src[key]))
                   if key in src else "none")
      out[key] = target
      continue
    if key not in src:
      raise errors.InputError(f"checkpoint has no {key!r} (model wants shape "
                              f"{tuple(target.shape)})")
    value = np.asarray(src[key])
    if key == POSEMB_KEY and value.shape != target.shape:
      logging.info("adapt: %s interpolated from %s to %s", key, value.shape,
                   tuple(target.shape))
      value = resize_posemb(value, target.shape, has_class_token="cls" in dst)
    if key in models.POSEMB_2D_KEYS and value.shape != target.shape:
      logging.info("adapt: %s interpolated from %s to %s", key, value.shape,
                   tuple(target.shape))
      value = resize_table(value, target.shape[0])
    if value.shape != target.shape:
      raise errors.InputError(
          f"{key!r} has shape {value.shape} in the checkpoint but "
          f"the model wants {tuple(target.shape)}")
    out[key] = value.astype(target.dtype)

  dropped = sorted({k.split("/")[0] for k in src if k not in dst
                    and k.startswith(_PRETRAINING_ONLY)})
  if dropped:
    logging.info("adapt: %s dropped (the model has none)", ", ".join(dropped))
  extra = [k for k in src
           if k not in dst and not k.startswith(_PRETRAINING_ONLY)]
  if extra:
    raise errors.InputError(
        f"checkpoint keys the model does not have: {extra[:5]}"
        f"{' ...' if len(extra) > 5 else ''}")
  if scanned:
    out = scan_blocks(out)
  return flax.traverse_util.unflatten_dict(out, sep="/")


def resize_posemb(posemb, target_shape, has_class_token):
  """(1, [1+] g*g, D) -> (1, [1+] G*G, D) by bilinear interpolation of the grid."""
  num_extra = 1 if has_class_token else 0
  src_grid = models.grid_side(posemb.shape[1] - num_extra,
                              _cannot_interpolate(posemb.shape))
  dst_grid = models.grid_side(target_shape[1] - num_extra,
                              _cannot_interpolate(target_shape))
  extra, grid = posemb[:, :num_extra], posemb[0, num_extra:]
  grid = grid.reshape(src_grid, src_grid, -1)
  zoom = (dst_grid / src_grid, dst_grid / src_grid, 1)
  grid = scipy.ndimage.zoom(grid, zoom, order=1)
  return np.concatenate([extra, grid.reshape(1, dst_grid * dst_grid, -1)], axis=1)


def resize_table(table, length):
  """[n, D] -> [length, D], linearly interpolated along the first axis."""
  return scipy.ndimage.zoom(table, (length / table.shape[0], 1), order=1)


def _cannot_interpolate(shape):
  return f"cannot interpolate {POSEMB_KEY!r} of shape {tuple(shape)}"
