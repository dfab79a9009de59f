"""A model's class probabilities on images, and their top classes as text
or JSON. `python -m vit_jax.predict` is the command line."""

import functools
import json

import jax
import numpy as np


def probabilities(inference, images, batch_size=64):
  """Softmax of the model's logits on uint8 `images` (or a NaFlex batch),
  [N, classes]."""
  return in_batches(_apply(inference.model), inference.params, images,
                    batch_size)


def in_batches(apply, params, inputs, batch_size):
  """apply(params, batch) on `inputs` (images, or a NaFlex batch:
  models/naflex.py) `batch_size` rows at a time, as one numpy array."""
  # On the device once, not once per batch (docs/exports.md, "Speed").
  params = jax.device_put(params)
  count = len(jax.tree.leaves(inputs)[0])
  return np.concatenate([
      np.asarray(apply(params, jax.tree.map(
          lambda x, start=start: x[start:start + batch_size], inputs)))
      for start in range(0, count, batch_size)])


@functools.lru_cache(maxsize=4)
def _apply(model):
  return jax.jit(lambda params, images: jax.nn.softmax(
      model.apply({"params": params}, images, train=False)))


def class_name(names, i):
  """The name of class `i`; "class i" where `names` has none."""
  return names[i] if names and i < len(names) else f"class {i}"


def top_classes(probs, k, names=None):
  """Per row of `probs`, the k best as [(class, name, probability)], best
  first."""
  k = min(k, probs.shape[-1])
  best = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
  return [[(int(i), class_name(names, int(i)), float(row[i])) for i in order]
          for row, order in zip(probs, best)]


def as_text(path, top):
  """The image's path, then a line per class: rank, probability, name."""
  return "\n".join([path] + [f"  {rank}. {p:7.2%}  {name}"
                             for rank, (_, name, p) in enumerate(top, 1)])


def as_json(path, top, grid=None):
  """One JSON line: the image, its top classes and, for NaFlex, the grid
  ([rows, cols] of patches) it was seen at (as features.as_json gives)."""
  line = {"image": path, "top": [
      {"class": c, "name": name, "probability": p} for c, name, p in top]}
  if grid is not None:
    line["grid"] = [int(x) for x in grid]
  return json.dumps(line)
