"""What a config will cost on a TPU v3 slice, learned before it is rented.

The config's own train step (`train.build`: the function and shardings a
run uses) is built from abstract shapes and compiled ahead of time for the
slice by libtpu (`pip install 'vit_jax[tpu]'`) on this host's CPU: nothing
is allocated on a TPU and no data is read. The compiled program gives:

  - HBM per core: arguments (params, optimizer state, the batch),
    temporaries (activations, gradients) and code, against a v3 core's
    16 GiB;
  - FLOPs per core per step and the compiler's step-time estimate
    (`optimal_seconds` of its cost model), hence the MFU against the
    core's 61.5 TFLOP/s bfloat16 peak;
  - TPUv3-core-days: total steps x step time x cores / 86,400, plus an
    allowance (`overhead`) for evaluation, checkpoints and restarts.

A config that does not fit is told what would make it fit. The process
must compile for TPUs while it runs on the CPU: its entry point calls
`runtime.compile_ahead_of_time()` first. `python -m vit_jax.plan` is the
command line.
"""

import dataclasses
import math
import re
import time

import jax
import jax.numpy as jnp
from jax.experimental import topologies

from vit_jax import compute, errors, input_pipeline, sharding, train
from vit_jax.datasets import vtab

GiB = 2**30
# A TPU v3 core: 16 GiB of HBM; JAX shows each core as one device.
HBM_BYTES_PER_CORE = 16 * GiB
PEAK_FLOPS_PER_CORE = compute.PEAK_FLOPS_PER_DEVICE["TPU v3"]
CHIPS_PER_HOST = (2, 2, 1)  # A v3 host: 4 chips, 8 cores.
# The Cloud TPU v3 slices, by core count: their chip grids.
V3_SLICES = {8: "2x2", 32: "4x4", 64: "4x8", 128: "8x8", 256: "8x16",
             512: "16x16", 1024: "16x32", 2048: "32x32"}
# Evaluation, checkpoints and restarts after preemption, on top of the
# training steps. A stated guess, not a measurement: Table 2's pre-training
# evaluates about 0.2% of the images it trains on (51,200 held out plus the
# few-shot sets every 10k steps of 4,096 x 3 forward-passes' worth), and a
# checkpoint every 5,000 steps costs seconds of asynchronous writing; the
# rest is startup compiles and the steps lost to preemptions.
DEFAULT_OVERHEAD = 0.05

# Class counts of pre-training sets that are no TFDS catalog dataset, for
# the size of the head when their files are not on this machine: JFT-300M
# has 18,291 classes (BiT, Kolesnikov et al. 2020), the fall 2011
# ImageNet-21k release 21,843 (the released i21k checkpoints' heads).
UNLISTED_NUM_CLASSES = {"jft300m": 18_291, "imagenet21k": 21_843}


def topology(name):
  """'v3-512' (a Cloud TPU slice) or 'v3:16x16' (a chip grid) -> (devices,
  slice name). The devices are libtpu's description of the slice: they can
  be compiled for, not run on."""
  match = re.fullmatch(r"v3-(\d+)", name)
  if match:
    cores = int(match.group(1))
    if cores not in V3_SLICES:
      raise errors.InputError(
          f"there is no TPU {name} slice; the v3 slices are "
          + ", ".join(f"v3-{n}" for n in V3_SLICES))
    grid = V3_SLICES[cores]
  else:
    match = re.fullmatch(r"v3:(\d+x\d+)", name)
    if not match:
      raise errors.InputError(
          f"--topology={name!r}: expected a v3 slice such as "
          "v3-512 or a chip grid such as v3:16x16")
    grid = match.group(1)
  description = topologies.get_topology_desc(
      platform="tpu", topology_name=f"v3:{grid}", chip_config_name="default",
      chips_per_host_bounds=CHIPS_PER_HOST, num_slices=1)
  devices = description.devices
  return devices, f"v3-{len(devices)}"


def num_classes(config, override=0):
  """The head's class count: `override`, else the dataset's (prepared here,
  a VTAB task, a TFDS catalog entry, or UNLISTED_NUM_CLASSES)."""
  if override:
    return override
  data_dir = config.data_dir
  try:
    return input_pipeline.num_classes(config.dataset, data_dir)
  except ValueError:
    pass  # Not prepared on this machine; its size is known elsewhere.
  name = config.dataset.split(":")[0]
  if config.dataset.startswith(input_pipeline.VTAB_PREFIX):
    return vtab.get(config.dataset[len(input_pipeline.VTAB_PREFIX):]
                    ).num_classes
  if name in UNLISTED_NUM_CLASSES:
    return UNLISTED_NUM_CLASSES[name]
  try:
    import tensorflow_datasets as tfds
    builder = tfds.builder(name)
    return builder.info.features[
        input_pipeline.LABEL_FEATURES.get(name, "label")].num_classes
  except Exception as e:  # TFDS raises many kinds for an unknown name.
    raise errors.ConfigError(
        f"cannot tell how many classes config.dataset={config.dataset!r} "
        f"has ({type(e).__name__}: {e}); pass --num_classes") from e


@dataclasses.dataclass
class Plan:
  """What one config costs on one slice; `to_json` is --json's object.

  A step that does not fit has the HBM the compiler found it needs, and
  no estimate (None; null in JSON): plan it again once it fits.
  """
  topology: str
  cores: int
  mesh: dict
  batch_size: int
  accum_steps: int
  fits: bool                  # the compiler's verdict
  hbm_argument_bytes: int     # params, optimizer state, batch (per core)
  hbm_temp_bytes: int         # activations, gradients, workspace
  hbm_bytes_per_core: int     # all of it, code and unaliased outputs too
  flops_per_core_per_step: float | None        # the compiler's count
  model_flops_per_core_per_step: float         # compute.flops_per_image's
  estimated_step_seconds: float | None
  total_steps: int
  overhead: float
  compile_seconds: float       # the step as configured
  cost_compile_seconds: float  # its twins' without loops, if it has loops
  suggestions: list

  @property
  def mfu(self):
    """Model FLOPs (no recomputation counted) over the cores' peak."""
    if self.estimated_step_seconds is None:
      return None
    return (self.model_flops_per_core_per_step
            / (self.estimated_step_seconds * PEAK_FLOPS_PER_CORE))

  @property
  def train_core_days(self):
    if self.estimated_step_seconds is None:
      return None
    return (self.total_steps * self.estimated_step_seconds * self.cores
            / compute.SECONDS_PER_DAY)

  @property
  def predicted_core_days(self):
    days = self.train_core_days
    return None if days is None else days * (1 + self.overhead)

  def to_json(self):
    return {**dataclasses.asdict(self),
            "hbm_capacity_bytes": HBM_BYTES_PER_CORE, "mfu": self.mfu,
            "train_core_days": self.train_core_days,
            "predicted_core_days": self.predicted_core_days}


def build_step(config, devices, classes, unroll=False):
  """(program, batch shapes) of `config`'s step over `devices`: checked
  and built as train.py builds it, nothing compiled yet."""
  try:
    mesh = sharding.make_mesh(config.mesh, devices)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e
  train.check_program(config, mesh)
  program = train.build(config, mesh, classes, unroll)
  size, batch = config.image_size, config.batch_size
  # The global batch as the input pipeline feeds it: uint8 images.
  shapes = {"image": jax.ShapeDtypeStruct((batch, size, size, 3), jnp.uint8,
                                          sharding=program.batch_sharding),
            "label": jax.ShapeDtypeStruct((batch,), jnp.int32,
                                          sharding=program.batch_sharding),
            "mask": jax.ShapeDtypeStruct((batch,), jnp.float32,
                                         sharding=program.batch_sharding)}
  return program, shapes


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
  """The bytes per core that XLA's out-of-HBM error reports, or None for
  another error. Its "G" is GiB."""
  if "RESOURCE_EXHAUSTED" not in message:
    return None
  match = (re.search(r"\(([\d.]+)G\) exceeds available HBM", message)
           or re.search(r"Used ([\d.]+)G of", message))
  return int(float(match.group(1)) * GiB) if match else 0


def bytes_per_core(shapes):
  """What a tree of sharded ShapeDtypeStructs holds on one device."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(shapes))


def _cost(compiled):
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost  # Older JAX: a list.
  return {key: float(cost[key]) for key in ("flops", "optimal_seconds")}


def unrolled_cost(config, devices, classes):
  """({flops, optimal_seconds} or None, compile seconds) of `config`'s step
  as if its loops were unrolled.

  XLA's cost analysis counts the body of a loop once, whatever its trip
  count, so a scanned encoder or a micro-batch loop would look cheap; and
  unrolling them all can overflow HBM, which stops the compile. The cost is
  linear in the layers L and in the micro-batches A: twins of the step with
  L in {1, 2} (or all its layers, when not scanned) and A in {1, 2} (or 1),
  each at the same micro-batch and with nothing looped, give it. None when
  a twin does not fit.
  """
  layers = compute.model_sizes(config.model).num_layers
  accum = config.accum_steps
  micro_batch = config.batch_size // accum
  layer_points = (1, 2) if config.model.scan_layers else (layers,)
  accum_points = (1, 2) if accum > 1 else (1,)
  costs, seconds = {}, 0.0
  for num_layers in layer_points:
    for micro_batches in accum_points:
      twin = config.copy_and_resolve_references()
      with twin.unlocked():  # num_layers may come from the model's name.
        twin.model.update(scan_layers=False, num_layers=num_layers)
      twin.update(accum_steps=micro_batches,
                  batch_size=micro_batch * micro_batches)
      compiled, _, took = compile_step(*build_step(twin, devices, classes,
                                                   unroll=True))
      seconds += took
      if compiled is None:
        return None, seconds
      costs[num_layers, micro_batches] = _cost(compiled)

  def extrapolate(at_1, at_2, n):
    return {key: at_1[key] + (n - 1) * (at_2[key] - at_1[key])
            for key in at_1}

  per_layers = {
      num_layers: (extrapolate(costs[num_layers, 1], costs[num_layers, 2],
                               accum) if accum > 1 else costs[num_layers, 1])
      for num_layers in layer_points}
  if config.model.scan_layers:
    return extrapolate(per_layers[1], per_layers[2], layers), seconds
  return per_layers[layers], seconds


def plan(config, topology_name, classes=0, overhead=DEFAULT_OVERHEAD):
  """Compiles `config`'s train step for the slice and reads its cost."""
  devices, slice_name = topology(topology_name)
  classes = num_classes(config, classes)
  program, batch = build_step(config, devices, classes)
  compiled, needed, seconds = compile_step(program, batch)
  cost, cost_seconds = None, 0.0  # No estimate for a step that cannot run.
  if compiled is None:  # The compiler stops at the temporaries it cannot place.
    arguments = bytes_per_core((program.state_shapes, batch))
    temporaries, hbm = needed, arguments + needed
  else:
    memory = compiled.memory_analysis()
    arguments, temporaries = (memory.argument_size_in_bytes,
                              memory.temp_size_in_bytes)
    hbm = (arguments + memory.output_size_in_bytes - memory.alias_size_in_bytes
           + temporaries + memory.generated_code_size_in_bytes)
    if config.model.scan_layers or config.accum_steps > 1:
      cost, cost_seconds = unrolled_cost(config, devices, classes)
    else:
      cost = _cost(compiled)
  model_flops = compute.flops_per_image(
      config.model, config.image_size, train=True,
      num_classes=classes) * config.batch_size / len(devices)
  result = Plan(
      topology=slice_name, cores=len(devices),
      mesh=dict(program.batch_sharding.mesh.shape),
      batch_size=config.batch_size, accum_steps=config.accum_steps,
      fits=compiled is not None, hbm_argument_bytes=int(arguments),
      hbm_temp_bytes=int(temporaries), hbm_bytes_per_core=int(hbm),
      flops_per_core_per_step=cost and cost["flops"],
      model_flops_per_core_per_step=float(model_flops),
      estimated_step_seconds=cost and cost["optimal_seconds"],
      total_steps=int(config.total_steps), overhead=overhead,
      compile_seconds=seconds, cost_compile_seconds=cost_seconds,
      suggestions=[])
  if not result.fits:
    result.suggestions = suggestions(config, result)
  return result


def suggestions(config, result):
  """What would bring a plan that does not fit under 16 GiB per core, each
  with the estimate that makes it a candidate; `plan` again to be sure."""
  out = []
  args, temp = result.hbm_argument_bytes, result.hbm_temp_bytes
  mesh = result.mesh
  per_core_batch = config.batch_size // (mesh["data"] * mesh["fsdp"])
  if mesh["fsdp"] == 1:
    fsdp = min(16, mesh["data"])
    out.append(
        f"--config.mesh.fsdp={fsdp}: params and optimizer state split "
        f"{fsdp} ways instead of copied on every core ({args / GiB:.1f} GiB "
        f"of arguments now, about {args / fsdp / GiB:.1f} GiB then)")
  if not config.model.remat_policy:
    out.append(
        "--config.model.remat_policy=nothing_saveable: the backward pass "
        "recomputes each block, so only the blocks' inputs are kept "
        f"({temp / GiB:.1f} GiB of temporaries now; costs about a third "
        "more FLOPs); dots_with_no_batch_dims_saveable keeps the matmuls' "
        "outputs and recomputes less")
  if per_core_batch % (2 * config.accum_steps) == 0:
    accum = 2 * config.accum_steps
    out.append(
        f"--config.accum_steps={accum}: {per_core_batch // accum} images per "
        f"core at a time instead of {per_core_batch // config.accum_steps}, "
        "about halving the activations, at the same batch")
  if not config.model.scan_layers:
    out.append("--config.model.scan_layers=True with a remat_policy: one "
               "compiled block for all layers, keeping what the policy saves "
               "(without remat, a scan keeps more than unrolled layers do)")
  bigger = [n for n in V3_SLICES if n > result.cores]
  if bigger:
    out.append(f"--topology=v3-{bigger[0]}: fewer images per core")
  return out


def describe(config_name, result):
  """The plan as the lines a person reads."""
  mesh = sharding.describe_mesh(result.mesh)
  per_core = result.batch_size / result.cores
  verdict = ("fits" if result.fits else
             "DOES NOT FIT (the compiler stopped at the temporaries)")
  lines = [
      f"{config_name} on TPU {result.topology} ({result.cores // 8} hosts)",
      f"  mesh          {mesh}; batch {result.batch_size}, {per_core:g} "
      f"per core" + (f", {result.accum_steps} micro-batches"
                     if result.accum_steps > 1 else ""),
      f"  HBM per core  {result.hbm_argument_bytes / GiB:.2f} GiB arguments "
      f"+ {result.hbm_temp_bytes / GiB:.2f} GiB temporaries = "
      f"{result.hbm_bytes_per_core / GiB:.2f} GiB of "
      f"{HBM_BYTES_PER_CORE / GiB:.0f}: {verdict}"]
  if result.estimated_step_seconds is None:
    lines.append("  step time     no estimate until it fits")
  else:
    days = result.predicted_core_days
    lines += [
        f"  FLOPs         {result.flops_per_core_per_step:.3g} per core per "
        f"step (compiler's count); the model's matmuls "
        f"{result.model_flops_per_core_per_step:.3g}",
        f"  step time     {result.estimated_step_seconds:.4g} s (compiler's "
        f"estimate): MFU {result.mfu:.1%} of "
        f"{PEAK_FLOPS_PER_CORE / 1e12:.1f} TFLOP/s per core",
        f"  steps         {result.total_steps:,}",
        f"  core-days     {_number(result.train_core_days)} training + "
        f"{result.overhead:.0%} for evaluation, checkpoints and restarts = "
        f"{_number(days)} TPUv3-core-days ({_number(days / result.cores * 24)}"
        f" hours on {result.cores} cores)"]
  lines.append(
      f"  compiled in   {result.compile_seconds:.0f} s" + (
          f", and {result.cost_compile_seconds:.0f} s for the estimate "
          "(its twins without loops)" if result.cost_compile_seconds
          else ""))
  if result.suggestions:
    lines.append("  to make it fit, try:")
    lines.extend(f"    {s}" for s in result.suggestions)
  return "\n".join(lines)


def _number(x):
  return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
