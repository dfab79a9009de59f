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
from vit_jax.analysis import classify


def features(inference, images, batch_size=64):
  """float32 features [N, width] of the model on `images` (uint8 pixels,
  floats in [-1, 1], or a NaFlex batch)."""
  return classify.in_batches(_apply(inference.model), inference.params,
                             images, batch_size).astype(np.float32)


def of_export(served, pixels, batch_size=64):
  """The same from a StableHLO export (serving.Served): its pre_logits."""
  return np.concatenate([
      served(pixels[start:start + batch_size])["pre_logits"]
      for start in range(0, len(pixels), batch_size)])


@functools.lru_cache(maxsize=4)
def _apply(model):
  return jax.jit(lambda params, images: models.logits_and_pre_logits(
      model, params, images)[1])


def as_json(path, row, grid=None):
  """One JSON line: the image, its features and, for NaFlex, the grid
  ([rows, cols] of patches) it was seen at."""
  line = {"image": path, "features": [float(x) for x in row]}
  if grid is not None:
    line["grid"] = [int(x) for x in grid]
  return json.dumps(line)


def as_text(path, row, grid=None, first=4):
  """The image's path, then its width, L2 norm and `first` values (and
  its NaFlex grid)."""
  values = " ".join(f"{x:.4f}" for x in row[:first])
  seen = "" if grid is None else f", grid {grid[0]}x{grid[1]}"
  return (f"{path}\n  width {len(row)}, L2 norm "
          f"{float(np.linalg.norm(row)):.4f}{seen}: {values} ...")
