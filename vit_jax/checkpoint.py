"""Checkpoints: orbax train state, released `.npz` interchange, adapting trees.

Train state goes through orbax: it writes each step to a temporary directory
and renames it when complete, so a crash mid-save never leaves a corrupt
checkpoint behind, and arrays are read back without pickle.

Our params tree uses the module names of the released vit_jax files, so the
release layout is just the tree flattened with '/'. Two more layouts load:
big_vision's (modules numbered per type, position embedding at the top) and
big_vision's scanned one (one `encoderblock` whose arrays carry a leading
layer axis).
"""

import os
import re

import flax
import numpy as np
import orbax.checkpoint as ocp
import scipy.ndimage

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"

# big_vision numbers modules per type; the release counts across types.
_BIG_VISION_BLOCK_NAMES = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def manager(directory, keep):
  """An orbax CheckpointManager keeping the newest `keep` steps."""
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))


def save(checkpoints, step, state, progress):
  """Saves `state` (a pytree of jax.Arrays) and `progress` (JSON) at `step`."""
  checkpoints.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave(progress)))


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
  """Writes `params` as a flat .npz in the released vit_jax layout."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
  with open(path, "wb") as f:
    np.savez(f, **{k: np.asarray(v) for k, v in flat.items()})


def load_npz(path):
  """Reads a released, big_vision or scanned big_vision .npz into our tree."""
  try:
    with np.load(path, allow_pickle=False) as npz:
      flat = {key: npz[key] for key in npz.files}
  except ValueError as e:
    if "allow_pickle" in str(e):
      raise ValueError(
          f"{path} holds pickled objects; only plain arrays are loaded, "
          "never pickle") from e
    raise
  return flax.traverse_util.unflatten_dict(to_release_layout(flat), sep="/")


def to_release_layout(flat):
  """Renames a flat {'a/b/c': array} dict of any known layout to the release's."""
  if any(k.startswith("Transformer/encoderblock/") for k in flat):
    flat = _unscan_blocks(flat)
  if any("/MlpBlock_0/" in k for k in flat):
    flat = {_rename_big_vision_key(k): v for k, v in flat.items()}
  return flat


def _unscan_blocks(flat):
  out = {}
  for key, value in flat.items():
    if key.startswith("Transformer/encoderblock/"):
      rest = key[len("Transformer/encoderblock/"):]
      for i, layer in enumerate(value):
        out[f"Transformer/encoderblock_{i}/{rest}"] = layer
    else:
      out[key] = value
  return out


def _rename_big_vision_key(key):
  if key == "pos_embedding":
    return POSEMB_KEY
  match = re.match(r"(Transformer/encoderblock_\d+/)([^/]+)(/.*)", key)
  if match and match.group(2) in _BIG_VISION_BLOCK_NAMES:
    prefix, module, rest = match.groups()
    return prefix + _BIG_VISION_BLOCK_NAMES[module] + rest
  return key


def adapt(restored, init_params):
  """Makes a restored params tree fit the model that produced `init_params`.

  - position embeddings of another grid size are interpolated (bilinear over
    the patch grid, as the released fine-tuning code does); the class-token
    embedding is kept as is;
  - a head of another class count (or one that sat on a pre-logits layer the
    target drops) is replaced by the target's fresh, zero-initialised head;
  - a pre-logits layer that the target has none of is dropped.
  Any other mismatch raises a ValueError naming the key and both shapes.
  """
  src = flax.traverse_util.flatten_dict(flax.core.unfreeze(restored), sep="/")
  dst = flax.traverse_util.flatten_dict(flax.core.unfreeze(init_params), sep="/")
  dropped_pre_logits = any(k.startswith("pre_logits/") for k in src) and not any(
      k.startswith("pre_logits/") for k in dst)

  out = {}
  for key, target in dst.items():
    if key.startswith("head/") and (
        dropped_pre_logits or key not in src or src[key].shape != target.shape):
      out[key] = target
      continue
    if key not in src:
      raise ValueError(f"checkpoint has no {key!r} (model wants shape "
                       f"{tuple(target.shape)})")
    value = np.asarray(src[key])
    if key == POSEMB_KEY and value.shape != target.shape:
      value = resize_posemb(value, target.shape, has_class_token="cls" in dst)
    if value.shape != target.shape:
      raise ValueError(f"{key!r} has shape {value.shape} in the checkpoint but "
                       f"the model wants {tuple(target.shape)}")
    out[key] = value.astype(target.dtype)

  extra = [k for k in src if k not in dst and not k.startswith("pre_logits/")]
  if extra:
    raise ValueError(f"checkpoint keys the model does not have: {extra[:5]}"
                     f"{' ...' if len(extra) > 5 else ''}")
  return flax.traverse_util.unflatten_dict(out, sep="/")


def resize_posemb(posemb, target_shape, has_class_token):
  """(1, [1+] g*g, D) -> (1, [1+] G*G, D) by bilinear interpolation of the grid."""
  num_extra = 1 if has_class_token else 0
  src_grid = _square_side(posemb.shape[1] - num_extra, posemb.shape)
  dst_grid = _square_side(target_shape[1] - num_extra, target_shape)
  extra, grid = posemb[:, :num_extra], posemb[0, num_extra:]
  grid = grid.reshape(src_grid, src_grid, -1)
  zoom = (dst_grid / src_grid, dst_grid / src_grid, 1)
  grid = scipy.ndimage.zoom(grid, zoom, order=1)
  return np.concatenate([extra, grid.reshape(1, dst_grid * dst_grid, -1)], axis=1)


def _square_side(num_tokens, shape):
  side = int(round(np.sqrt(num_tokens)))
  if side * side != num_tokens:
    raise ValueError(f"{POSEMB_KEY!r} of shape {tuple(shape)} is not a square "
                     "grid of patches; cannot interpolate it")
  return side
