"""Every sharding decision of the project: the mesh, the rules, the batch.

The mesh has three axes:
  data   pure data parallelism: params replicated, batch split;
  fsdp   data parallelism with params and optimizer state split too
         (ZeRO-3 style; XLA gathers each weight where it is used);
  model  tensor parallelism: attention heads and MLP hidden units split.

Parameters carry logical axis names (set in vit_jax/models/: the ViT's
modules and resnet.py). The table
below maps them to mesh axes, and then FSDP splits the largest dimension that
the table left unsharded and that `fsdp` divides (never a scanned model's
`layers`). The batch is split over `data` and `fsdp` together, and so is
each block's input inside the jitted step (its logical "batch" axis).

Over several TPU slices (multislice), joined by the data-center network,
the data axis is the one that crosses between them (`make_mesh`).
"""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from vit_jax import errors

MESH_AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")

# Logical axis name -> mesh axis (None: not by rule; FSDP may still take it).
LOGICAL_AXIS_RULES = (
    ("batch", BATCH_AXES),  # activations' examples, as the batch's
    ("tokens", None),   # activations' patch tokens
    ("embed", None),    # model width D
    ("mlp", "model"),   # MLP hidden units; also the pre-logits width
    ("heads", "model"), # attention heads
    ("kv", None),       # per-head width D/heads
    ("classes", None),  # head outputs
    ("layers", None),   # the stacked blocks of a scanned encoder
    ("prototypes", None),  # a DINO head's; FSDP splits the large matrix
    ("vocab", None),    # a text tower's token embeddings; FSDP splits them
  # A hybrid's ResNet: its kernels' input and output channels, and its
  # GroupNorms' (the stem is data parallel, like the patch embedding).
  ("in_channels", None),
  ("channels", None),
)
# FSDP never splits these: a scan step slices one block out of the stack,
# and a stack split along its layers would be gathered whole for that.
NOT_FSDP = ("layers",)


def make_mesh(axis_sizes, devices=None):
  """A Mesh over ('data', 'fsdp', 'model'); one size may be -1 (the rest).

  `axis_sizes` may also hold `slices`: how many TPU slices the devices
  span, joined by the data-center network (DCN); -1 or absent: as many as
  they are in (a multislice TPU's devices carry their slice_index, others
  are in one). Over several slices only `data` crosses between them, its
  outer part; fsdp and model, which move far more bytes, stay inside each
  slice. Devices that do not know their slice (CPU) emulate slices with
  one process each.
  """
  devices = jax.devices() if devices is None else devices
  # A dict, or the Settings' mesh section (runs/settings.py).
  sizes = (dataclasses.asdict(axis_sizes)
           if dataclasses.is_dataclass(axis_sizes) else dict(axis_sizes))
  slices = int(sizes.pop("slices", -1))
  sizes.pop("fsdp_min_bytes", None)  # tree_shardings', not the mesh's.
  if slices == 0 or slices < -1:
    raise errors.InputError(
        f"config.mesh.slices must be positive or -1, got {slices}")
  unknown = set(sizes) - set(MESH_AXES)
  if unknown:
    raise errors.InputError(
        f"config.mesh has unknown axes {sorted(unknown)}; the "
        f"axes are {MESH_AXES}")
  sizes = {axis: int(sizes.get(axis, 1)) for axis in MESH_AXES}
  free = [axis for axis, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise errors.InputError(f"config.mesh: only one axis may be -1, got {free}")
  if any(size == 0 or size < -1 for size in sizes.values()):
    raise errors.InputError(
        f"config.mesh sizes must be positive or -1, got {sizes}")
  fixed = math.prod(size for size in sizes.values() if size != -1)
  if free:
    if len(devices) % fixed:
      raise errors.InputError(f"config.mesh {describe_mesh(sizes)}: {len(devices)} "
                              f"devices are not divisible by {fixed}")
    sizes[free[0]] = len(devices) // fixed
  if math.prod(sizes.values()) != len(devices):
    raise errors.InputError(
        f"config.mesh {describe_mesh(sizes)} needs {math.prod(sizes.values())} "
        f"devices, but there are {len(devices)}")
  shape = tuple(sizes[axis] for axis in MESH_AXES)
  count = _slice_count(devices, slices)
  try:
    if count == 1:
      # Auto axes: we fix the shardings of params and batches, XLA
      # propagates them through the step (jax.make_mesh would otherwise
      # default to Explicit).
      return jax.make_mesh(shape, MESH_AXES,
                           axis_types=(AxisType.Auto,) * 3, devices=devices)
    return jax.sharding.Mesh(_hybrid_devices(sizes, count, devices),
                             MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  except NotImplementedError:  # A TPU torus side it would have to split.
    raise MeshLayoutError(
        f"config.mesh {describe_mesh(sizes)} cannot be laid out on these "
        f"TPU chips: each mesh axis must span whole sides of their torus "
        f"(vit_jax.plan names the fsdp sizes that can)") from None


def _slice_count(devices, wanted):
  """How many slices the devices are in: by slice_index on TPUs, else by
  process (an emulation, when `wanted` > 1); `wanted` -1 or that count."""
  if _on_tpu(devices):
    count = len({getattr(device, "slice_index", 0) for device in devices})
  elif wanted > 1:
    count = len({device.process_index for device in devices})
  else:
    return 1
  if wanted not in (-1, count):
    unit = (f"slice{'s' * (count > 1)}" if _on_tpu(devices) else
            f"process{'es' * (count > 1)} (each stands for a slice off TPUs)")
    raise errors.InputError(
        f"config.mesh.slices={wanted}, but the {len(devices)} devices are "
        f"in {count} {unit}")
  return count


def _on_tpu(devices):
  """Whether the devices are TPUs, which know their slice; JAX gives
  every device a slice_index, but only a TPU's tells."""
  return devices[0].platform == "tpu"


def _hybrid_devices(sizes, count, devices):
  """The mesh's device array over `count` slices: `data` split into slices
  x data-per-slice, each slice laid out on its own chips."""
  if sizes["data"] % count:
    raise errors.InputError(
        f"config.mesh {describe_mesh(sizes)} over {count} slices: "
        f"data={sizes['data']} is not a multiple of {count}; only "
        "the data axis crosses between slices (fsdp and model stay inside "
        "one)")
  inner = (sizes["data"] // count, sizes["fsdp"], sizes["model"])
  return mesh_utils.create_hybrid_device_mesh(
      inner, (count, 1, 1), devices, process_is_granule=not _on_tpu(devices))


class MeshLayoutError(errors.InputError):
  """A mesh whose axes do not fall on whole sides of the chips' torus:
  jax.make_mesh splits a side on v5e alone (fsdp 8 has no place on
  v4-128's 4x4x4 chips)."""


def describe_mesh(sizes):
  """{"data": 4, "model": 2} (or a mesh's shape) -> "data=4 x model=2";
  config.mesh's other keys (slices) left out."""
  return " x ".join(f"{axis}={size}" for axis, size in sizes.items()
                    if axis in MESH_AXES)


def constrained(fn, mesh):
  """`fn`, traced on `mesh`, so that the model's activation constraints
  (`constrain`) take effect; elsewhere they do nothing. The train step and
  the evaluators' functions are jitted so."""
  @functools.wraps(fn)
  def traced(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args)
  return traced


def constrain(x, names):
  """x sharded as its logical axis `names` map through LOGICAL_AXIS_RULES,
  inside functions made by `constrained`; elsewhere x as it is.

  The rules are passed here rather than set for the whole trace: flax would
  then also apply them to the parameters' initialisers, which it traces to
  check shapes, and a DenseGeneral's flattened kernel has fewer axes than
  its names.
  """
  return nn.with_logical_constraint(x, names, rules=LOGICAL_AXIS_RULES)


def activation_spec(names):
  """The PartitionSpec of an activation whose axes have the logical `names`,
  by LOGICAL_AXIS_RULES: for code that runs per device (shard_map), such as
  a Pallas kernel, which XLA cannot split itself."""
  return nn.logical_to_mesh_axes(names, LOGICAL_AXIS_RULES)


def batch_sharding(mesh):
  """Leading (example) dimension split over data and fsdp."""
  return NamedSharding(mesh, P(BATCH_AXES))


def to_global(batch, sharding):
  """{name: this process's rows (numpy or tf)} -> {name: one jax.Array over
  the mesh}, laid out by `sharding` (batch_sharding: the leading, example
  axis split); each process passes the rows its devices hold, as the input
  pipeline yields them."""
  return {name: jax.make_array_from_process_local_data(sharding,
                                                       np.asarray(value))
          for name, value in batch.items()}


def replicated(mesh):
  return NamedSharding(mesh, P())


def data_parallel_size(mesh):
  return mesh.shape["data"] * mesh.shape["fsdp"]


def process_blocks(mesh):
  """(blocks, data-parallel size): which blocks of every global batch this
  process feeds. The batch is cut into one block per data-parallel device,
  in mesh order; a process feeds the blocks of its own devices, which must
  be consecutive (they are with jax.make_mesh, which keeps each host's
  devices together)."""
  num_blocks = data_parallel_size(mesh)
  rows = NamedSharding(mesh, P(BATCH_AXES)).addressable_devices_indices_map(
      (num_blocks,))
  blocks = sorted({index[0].start or 0 for index in rows.values()})
  if blocks != list(range(blocks[0], blocks[0] + len(blocks))):
    raise errors.InputError(
        f"process {jax.process_index()} holds batch blocks {blocks}, which "
        "are not consecutive; build the mesh so that each host's devices are "
        "adjacent along the data axes")
  return tuple(blocks), num_blocks


def partition_spec(names, shape, mesh, path="param", fsdp_min_bytes=0):
  """The PartitionSpec for one array with logical axis `names`; FSDP
  leaves an array of fewer than `fsdp_min_bytes` whole, counted in float32
  (so that a moment of another dtype is placed as its parameter is): a
  small array costs more to gather than to hold."""
  spec = list(nn.logical_to_mesh_axes(names, LOGICAL_AXIS_RULES))
  for dim, axis in enumerate(spec):
    if axis is not None and shape[dim] % mesh.shape[axis]:
      raise errors.InputError(
          f"{path}: dimension {dim} ({names[dim]}, size {shape[dim]}) is not "
          f"divisible by the mesh axis '{axis}' of size {mesh.shape[axis]}")
  fsdp = mesh.shape["fsdp"]
  if fsdp > 1 and math.prod(shape) * 4 >= fsdp_min_bytes:
    free = [d for d, axis in enumerate(spec)
            if axis is None and shape[d] % fsdp == 0
            and names[d] not in NOT_FSDP]
    if free:
      spec[max(free, key=lambda d: shape[d])] = "fsdp"
  return P(*spec)


def sharded_shapes(boxed_tree, mesh, fsdp_min_bytes=0):
  """(ShapeDtypeStructs carrying their shardings, the shardings) of a tree
  of abstract values whose leaves may be boxed (jax.eval_shape of an
  init): what compiling needs, nothing allocated."""
  shardings = tree_shardings(boxed_tree, mesh, fsdp_min_bytes)
  shapes = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      nn.meta.unbox(boxed_tree), shardings)
  return shapes, shardings


def tree_shardings(boxed_tree, mesh, fsdp_min_bytes=0):
  """NamedShardings for a tree whose array leaves may be nn.Partitioned boxes.

  Boxed leaves (params and the optimizer's per-param moments) follow the
  rules, FSDP only for those of `fsdp_min_bytes` or more; plain leaves (step
  counters) are replicated.
  """
  def sharding(path, leaf):
    if isinstance(leaf, nn.LogicallyPartitioned):
      if isinstance(leaf.value, optax.MaskedNode):
        return leaf.value  # A frozen parameter's moment: nothing to place.
      spec = partition_spec(leaf.names, leaf.value.shape, mesh,
                            jax.tree_util.keystr(path), fsdp_min_bytes)
      return NamedSharding(mesh, spec)
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(
      sharding, boxed_tree,
      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))

