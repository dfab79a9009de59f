"""Fingerprints of a train state's arrays, computed where the arrays are.

A checkpoint carries one fingerprint per array, and a restore recomputes
them from what it read: bytes that changed on disk (a flipped bit that the
storage's own compression did not catch) are found before the run trains
on them. Each fingerprint is two sums of the array's bytes taken as
unsigned words, one of them weighted by the word's position: sums of
unsigned integers wrap around exactly, so they do not depend on how the
array is sharded or in which order the devices add, and a restore on
another mesh computes the same numbers. They are computed by one jitted
function on the devices and only the numbers (8 bytes an array) come to
the host.
"""

import jax
import jax.numpy as jnp
import numpy as np

# Odd multiplier of the position weights (Knuth's), and their offset, so that
# no word has weight 0 and neighbours weigh differently.
_MULTIPLIER = 2654435761
_OFFSET = 0x9E3779B9
_WORDS = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}


def _leaf(x):
  x = jnp.atleast_1d(x)
  words = jax.lax.bitcast_convert_type(x, _WORDS[x.dtype.itemsize])
  words = words.astype(jnp.uint32)
  position = jax.lax.broadcasted_iota(jnp.uint32, x.shape, 0)
  for axis in range(1, x.ndim):  # The flat index, wrapping as uint32 does.
    position = position * jnp.uint32(x.shape[axis]) + jax.lax.broadcasted_iota(
        jnp.uint32, x.shape, axis)
  weights = position * jnp.uint32(_MULTIPLIER) + jnp.uint32(_OFFSET)
  return jnp.stack([jnp.sum(words, dtype=jnp.uint32),
                    jnp.sum(words * weights, dtype=jnp.uint32)])


@jax.jit
def _all(leaves):
  return [_leaf(x) for x in leaves]


def of(tree):
  """{path: [sum, weighted sum]} of every array of `tree`, as plain ints."""
  paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(tree)[0])
  sums = jax.device_get(_all(list(leaves)))
  return {jax.tree_util.keystr(path): [int(s) for s in np.asarray(value)]
          for path, value in zip(paths, sums)}


def mismatches(expected, tree):
  """The paths of `tree`'s arrays whose fingerprints are not `expected`'s
  (missing ones included)."""
  found = of(tree)
  return sorted(path for path in expected.keys() | found.keys()
                if expected.get(path) != found.get(path))
