"""What the model's "auto" settings become on the devices that run (or a
plan compiles) the step; neither changes what the step computes.

`model.attention = "auto"`: cuDNN's fused kernel ("fused") on NVIDIA GPUs
in half precision without attention dropout, where it trains faster
(docs/speed_on_gpu.md), else the einsum (on TPUs XLA's fused attention
moves more bytes than the einsum: docs/plan.md).

`model.remat_policy = "auto"`: the step as written where it fits its
devices' memory, else the least recomputation that fits.

Only XLA's TPU compiler finds, while it compiles, that a step does not fit
(it stops at the temporaries it cannot place in HBM). So on TPUs "auto"
compiles the step with each policy of REMAT_BY_MEMORY in turn, keeping the
first that fits; elsewhere it is "" (everything kept), which a CPU's memory
or a GPU's allocator reports only when the step runs. A run (resolve.py)
and a plan (planning/cost.py) choose the same way, from the same compile,
and the run records its choice; remat changes no result.
"""

import re
import time

import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.data import packing
from vit_jax.models import naflex as naflex_lib

AUTO = "auto"

# models.REMAT_POLICIES from the most kept to the least: "" keeps every
# activation; dots_saveable every matmul's output, the attention's logits
# too; dots_with_no_batch_dims_saveable the dense layers' outputs, not the
# attention's [heads, tokens, tokens] products; nothing_saveable only each
# block's input (about a third more FLOPs: the forward again).
REMAT_BY_MEMORY = ("", "dots_saveable", "dots_with_no_batch_dims_saveable",
                   "nothing_saveable")


def attention(model, device):
  """What `model` (runs/settings.py's Model) computes attention with on
  `device`."""
  if model.attention == "splash" and device.platform == "gpu":
    # Pallas would interpret its TPU kernel op by op: a run of hours that
    # looks as if it hangs.
    raise errors.ConfigError(
        "config.model.attention='splash' is Pallas's TPU kernel, which a GPU "
        "could only interpret, many times slower than the einsum: use "
        "'fused' (cuDNN's kernel) or 'auto'")
  if model.attention != AUTO:
    return model.attention
  if (device.platform == "gpu" and model.dtype in ("bfloat16", "float16")
      and not model.attention_dropout_rate):
    return "fused"
  return "einsum"


def policies(remat_policy, device):
  """The remat policies to try, in order, for `remat_policy` on `device`'s
  platform."""
  if remat_policy != AUTO:
    return (remat_policy,)
  return REMAT_BY_MEMORY if device.platform == "tpu" else ("",)


def describe_tried(tried):
  """"'' needs 40.5 GiB of temporaries; ..." of [(policy, bytes)] that did
  not fit."""
  return "; ".join(f"{policy!r} needs {needed / 2**30:.1f} GiB of "
                   "temporaries" for policy, needed in tried)


def batch_shapes(keys, objective, batch_sharding):
  """The global batch of a run's settings `keys` as the input pipeline
  feeds it: uint8 images, or where config.naflex sets a budget, uint8
  patches and their grids, or packed sequences of them; and what the
  `objective` learns from (its `targets`: labels, or captions' tokens)."""
  model = objective.model
  def struct(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
  batch_size, image_size = keys.batch_size, keys.image_size
  images = {"image": struct((batch_size, image_size, image_size, 3),
                            jnp.uint8)}
  naflex = naflex_lib.budget_of(keys.naflex.max_num_patches, model)
  packs = packing.Packing.of(keys.naflex)
  if packs:  # Sequences of several images each (data/packing.py).
    return {name: struct(*spec) for name, spec in packing.batch_shapes(
        batch_size, naflex.patch_values, packs).items()}
  if naflex:
    images = {"image": struct((batch_size, naflex.max_num_patches,
                               naflex.patch_values), jnp.uint8),
              "grid": struct((batch_size, 2), jnp.int32)}
  return {**images, **{name: struct(*spec) for name, spec in
                       objective.targets(batch_size).items()},
          "mask": struct((batch_size,), jnp.float32)}


def compile_step(program, batch):
  """(compiled step, None, seconds), or (None, HBM bytes it needs, seconds)
  when the compiler finds that it does not fit."""
  start = time.perf_counter()
  try:
    compiled = program.train_step.lower(program.state_shapes, batch).compile()
  except jax.errors.JaxRuntimeError as e:
    needed = hbm_needed(str(e))
    if needed is None:
      raise
    return None, needed, time.perf_counter() - start
  return compiled, None, time.perf_counter() - start


def hbm_needed(message):
  """The bytes per device that XLA's out-of-HBM error reports, 0 where it
  names none, or None for another error. Its "G" is GiB, its "T" TiB."""
  if "RESOURCE_EXHAUSTED" not in message:
    return None
  match = (re.search(r"\(([\d.]+)([KMGT])\) exceeds available HBM", message)
           or re.search(r"Used ([\d.]+)([KMGT]) of", message))
  if not match:
    return 0
  size, unit = match.groups()
  return int(float(size) * 2**(10 * ("KMGT".index(unit) + 1)))
