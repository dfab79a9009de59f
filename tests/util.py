"""Small helpers shared by tests."""

import jax
import numpy as np


def randomize(tree, seed=0, scale=0.2):
  """Adds Gaussian noise to every leaf: fresh inits have zero heads and unit
  LayerNorm scales, which would hide mistakes that random weights expose."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: (np.asarray(x) + scale * rng.standard_normal(x.shape)).astype(
          np.asarray(x).dtype), tree)
