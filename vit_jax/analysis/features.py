"""A model's features on images: the pooled output that its head reads,
as JSON or a short text line. `python -m vit_jax.predict --features` is the
command line.

The features are the pre-logits that ClassifierHead sows (what the
StableHLO export calls `pre_logits`): the class token, the tokens' mean or
the attention pooling's output, through fc_norm where final_norm is
"pooled" and the tanh pre-logits layer where the model has one. So a
SigLIP tower gives its pooler output (its MAP head's), a DINOv2 its class
token after the last LayerNorm, and a headless source computes them too
(pretrained.inference_of(..., features=True)).
"""

import functools
import json

import jax
import numpy as np

from vit_jax import models


def features(inference, images, batch_size=64):
  """float32 features [N, width] of the model on `images` (uint8 pixels,
  or floats in [-1, 1])."""
  apply = _apply(inference.model)
  # On the device once, not once per batch (docs/exports.md, "Speed").
  params = jax.device_put(inference.params)
  return np.concatenate([
      np.asarray(apply(params, images[start:start + batch_size]), np.float32)
      for start in range(0, len(images), batch_size)])


def of_export(served, pixels, batch_size=64):
  """The same from a StableHLO export (serving.Served): its pre_logits."""
  return np.concatenate([
      served(pixels[start:start + batch_size])["pre_logits"]
      for start in range(0, len(pixels), batch_size)])


@functools.lru_cache(maxsize=4)
def _apply(model):
  return jax.jit(lambda params, images: models.logits_and_pre_logits(
      model, params, images)[1])


def as_json(path, row):
  return json.dumps({"image": path, "features": [float(x) for x in row]})


def as_text(path, row, first=4):
  """The image's path, then its width, L2 norm and `first` values."""
  values = " ".join(f"{x:.4f}" for x in row[:first])
  return (f"{path}\n  width {len(row)}, L2 norm "
          f"{float(np.linalg.norm(row)):.4f}: {values} ...")
