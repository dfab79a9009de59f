"""Fitting a checkpoint's params to another model: a new resolution (the
position embedding resized over the patch grid), a new head, no pre-logits
layer."""


import flax
import numpy as np
import scipy.ndimage
from absl import logging

from vit_jax import errors, models
from vit_jax.weights import npz

# What pre-training adds to a model and fine-tuning drops: the pre-logits
# layer, masked patch prediction's mask embedding and per-patch head, and a
# masked autoencoder's decoder (models/mae.py), self-distillation's heads
# (models/dino.py).
_PRETRAINING_ONLY = ("pre_logits/", "mask_embedding", "mpp_head/",
                     "decoder/", "dino_head/", "ibot_head/")


def adapt(restored, init_params):
  """Makes a restored params tree fit the model that produced `init_params`.

  - position embeddings of another grid size are interpolated (bilinear over
    the patch grid, as the released fine-tuning code does; the 2-D kind's
    row and column tables linearly along their length); the class-token
    embedding is kept as is;
  - a head of another class count (or one that sat on a pre-logits layer the
    target drops) is replaced by the target's fresh, zero-initialised head;
  - a pre-logits layer that the target has none of is dropped, and so are
    masked patch prediction's mask embedding and head
    (`vit_jax/models/masked_patches.py`).
  Any other mismatch raises an InputError naming the key and both shapes.
  Each change is logged. Either tree may be scanned (stacked blocks) or not,
  and `restored` may be in any layout `npz.to_release_layout` reads.
  `init_params` may hold jax.ShapeDtypeStructs; they come back as they are
  where the target keeps its own initialisation.
  """
  src = flax.traverse_util.flatten_dict(flax.core.unfreeze(restored), sep="/")
  src = npz.to_release_layout(src)
  dst = flax.traverse_util.flatten_dict(flax.core.unfreeze(init_params),
                                        sep="/")
  # A scanned model is matched layer by layer, then stacked again.
  scanned = any(key.startswith(npz.SCANNED_BLOCK) for key in dst)
  dst = npz.unscan_blocks(dst)
  dropped_pre_logits = any(
      k.startswith("pre_logits/")
      for k in src) and not any(k.startswith("pre_logits/") for k in dst)

  out = {}
  for key, target in dst.items():
    if key.split("/")[0] in models.HEADS and (
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
    if key == npz.POSEMB_KEY and value.shape != target.shape:
      logging.info("adapt: %s interpolated from %s to %s", key, value.shape,
                   tuple(target.shape))
      value = resize_posemb(value, target.shape, models.posemb_prefix(dst))
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
    out = npz.scan_blocks(out)
  return flax.traverse_util.unflatten_dict(out, sep="/")


def resize_posemb(posemb, target_shape, num_extra):
  """(1, num_extra + g*g, D) -> (1, num_extra + G*G, D) by bilinear
  interpolation of the grid; the `num_extra` rows of the class and
  distillation tokens are kept."""
  src_grid = models.grid_side(posemb.shape[1] - num_extra,
                              _cannot_interpolate(posemb.shape))
  dst_grid = models.grid_side(target_shape[1] - num_extra,
                              _cannot_interpolate(target_shape))
  extra, grid = posemb[:, :num_extra], posemb[0, num_extra:]
  grid = grid.reshape(src_grid, src_grid, -1)
  zoom = (dst_grid / src_grid, dst_grid / src_grid, 1)
  grid = scipy.ndimage.zoom(grid, zoom, order=1)
  return np.concatenate([extra, grid.reshape(1, dst_grid * dst_grid, -1)],
                        axis=1)


def resize_table(table, length):
  """[n, D] -> [length, D], linearly interpolated along the first axis."""
  return scipy.ndimage.zoom(table, (length / table.shape[0], 1), order=1)


def _cannot_interpolate(shape):
  return f"cannot interpolate {npz.POSEMB_KEY!r} of shape {tuple(shape)}"


def adapt_two_towers(towers, init_params):
  """A two-tower model's params (models/two_towers.py: img, txt, t, b) made
  to fit another's, `init_params`: the image tower as `adapt` fits a ViT
  (a new resolution's position table interpolated); the text tower, t
  and b as they are, their shapes the model's (an InputError names the
  first that differs). Either may be scanned."""
  out = {"img": adapt(towers["img"], init_params["img"])}
  text = flax.core.unfreeze(init_params["txt"])
  dst = flax.traverse_util.flatten_dict(text, sep="/")
  scanned = any(key.startswith(npz.SCANNED_BLOCK) for key in dst)
  dst = npz.unscan_blocks(dst)
  src = npz.unscan_blocks(flax.traverse_util.flatten_dict(
      flax.core.unfreeze(towers["txt"]), sep="/"))
  src.update(t=towers["t"], b=towers["b"])
  dst.update(t=init_params["t"], b=init_params["b"])
  kept = {}
  for key, target in dst.items():
    value = np.asarray(src[key]) if key in src else None
    if value is None or value.shape != tuple(target.shape):
      raise errors.InputError(
          f"{key!r} has shape {None if value is None else value.shape} in "
          f"the checkpoint but the model wants {tuple(target.shape)}: a "
          "two-tower checkpoint's text tower is taken as it is")
    kept[key] = value.astype(target.dtype)
  out.update(t=kept.pop("t"), b=kept.pop("b"))
  out["txt"] = flax.traverse_util.unflatten_dict(
      npz.scan_blocks(kept) if scanned else kept, sep="/")
  return out
