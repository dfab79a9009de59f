"""What a config will cost on a TPU slice, learned before it is rented.

The config's own train step (`train.build`: the function and shardings a
run uses) is built from abstract shapes and compiled ahead of time for the
slice by libtpu (`pip install 'vit_jax[tpu]'`) on this host's CPU: nothing
is allocated on a TPU and no data is read. Every Cloud TPU generation from
v3 to v6e (GENERATIONS) can be planned for. The compiled program gives:

  - HBM per device: arguments (params, optimizer state, the batch),
    temporaries (activations, gradients) and code, against the device's
    HBM (a v3 core's 16 GiB, a v5p chip's 95 GiB, ...);
  - FLOPs per device per step and the compiler's step-time estimate
    (`optimal_seconds` of its cost model), hence the MFU against the
    device's bfloat16 peak;
  - chip-hours: total steps x step time x chips / 3,600, plus an allowance
    (`overhead`) for evaluation, checkpoints and restarts; on v3 also
    TPUv3-core-days, the paper's unit.

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
SECONDS_PER_HOUR = 3_600


@dataclasses.dataclass(frozen=True)
class Generation:
  """A TPU generation: what Cloud TPU rents and libtpu compiles for.

  A slice is named `{accelerator}-N`, N its TensorCores (chips x
  cores_per_chip): Cloud TPU counts v2 to v5p slices in cores, v5e and v6e
  slices in chips, which have one core each, so N is both.
  """
  name: str              # its short name, libtpu's prefix: v5e:4x4
  accelerator: str       # the accelerator type's prefix: v5litepod-16
  chip_config: str       # libtpu's; "megacore" shows a chip's 2 cores as 1
  device_kind: str       # what JAX calls its devices
  cores_per_chip: int
  hbm_bytes: int         # per JAX device
  host_chips: int        # a slice of up to this many chips is one host
  grids: tuple           # the slices Cloud TPU offers, as chip grids

  @property
  def peak_flops(self):
    """bfloat16 FLOP/s per JAX device."""
    return compute.PEAK_FLOPS_PER_DEVICE[self.device_kind]

  def slice_name(self, chips):
    return f"{self.accelerator}-{chips * self.cores_per_chip}"

  @property
  def slices(self):
    """{"v4-8": "2x2x1", ...}: the Cloud TPU slices and their chip grids."""
    return {self.slice_name(_chips(grid)): grid for grid in self.grids}


# From Cloud TPU's documentation of each generation (system architecture,
# supported slice shapes). A multi-host slice is made of hosts of 2x2 chips
# (one TPU VM, one JAX process each): v3, v4 and v5p hosts hold 4 chips;
# v5e's and v6e's machines hold 8, but their multi-host slices run a VM on
# each half (ct5lp-hightpu-4t, ct6e-standard-4t), and only the 8-chip
# slice is one VM of 8.
GENERATIONS = {generation.name: generation for generation in (
    # 2 cores per chip, each its own JAX device with 16 GiB of the chip's
    # 32; a 2-D torus of up to 1,024 chips.
    Generation("v3", "v3", "default", "TPU v3", 2, 16 * GiB, 4,
               ("2x2", "4x4", "4x8", "8x8", "8x16", "16x16", "16x32",
                "32x32")),
    # 2 cores per chip that JAX drives as one device (megacore), 32 GiB;
    # 3-D slices of up to 2,048 chips here (a pod has 4,096).
    Generation("v4", "v4", "megacore", "TPU v4", 2, 32 * GiB, 4,
               ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8",
                "4x8x8", "8x8x8", "8x8x12", "8x8x16", "8x16x16")),
    # Megacore too, 95 GiB per chip; its common 3-D shapes up to the
    # largest single slice, 6,144 chips (others: a chip grid).
    Generation("v5p", "v5p", "megacore", "TPU v5", 2, 95 * GiB, 4,
               ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8",
                "4x8x8", "8x8x8", "8x8x16", "8x16x16", "16x16x16",
                "16x16x24")),
    # One core per chip, 16 GiB; a 2-D torus of up to 256 chips.
    Generation("v5e", "v5litepod", "default", "TPU v5 lite", 1, 16 * GiB, 8,
               ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    # Trillium: one core per chip, 32 GiB; up to 256 chips.
    Generation("v6e", "v6e", "default", "TPU v6 lite", 1, 32 * GiB, 8,
               ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
)}
# Accelerator-type prefixes: each generation's, and v5e's short name.
ACCELERATORS = {**{g.accelerator: g for g in GENERATIONS.values()},
                "v5e": GENERATIONS["v5e"]}
MULTI_HOST_CHIPS = (2, 2, 1)  # The hosts of a multi-host slice.

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


def _chips(grid):
  return math.prod(int(n) for n in grid.split("x"))


@dataclasses.dataclass
class Slice:
  """A TPU slice as libtpu describes it: devices to compile for, not run
  on."""
  name: str              # its accelerator type: v4-128
  generation: Generation
  grid: str              # its chips: 4x4x4
  devices: list

  @property
  def chips(self):
    return _chips(self.grid)

  @property
  def hosts(self):
    return len({device.process_index for device in self.devices})


def topology(name):
  """A Cloud TPU accelerator type ('v4-128') or a generation's chip grid
  ('v4:4x4x4', for a shape not in its `grids`) -> its Slice."""
  match = re.fullmatch(r"([a-z0-9]+)-(\d+)", name)
  if match and match.group(1) in ACCELERATORS:
    generation = ACCELERATORS[match.group(1)]
    slice_name = f"{generation.accelerator}-{match.group(2)}"
    if slice_name not in generation.slices:
      raise errors.InputError(
          f"there is no TPU {name} slice; the {generation.name} "
          f"slices are {', '.join(generation.slices)} (or a chip grid "
          f"such as {generation.name}:{generation.grids[-1]})")
    grid = generation.slices[slice_name]
  else:
    match = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)+)", name)
    if not match or match.group(1) not in GENERATIONS:
      raise errors.InputError(
          f"--topology={name!r}: expected a Cloud TPU slice, "
          + ", ".join(f"{g.accelerator}-N" for g in GENERATIONS.values())
          + " (or v5e-N), such as v3-512 or v4-128, or a chip grid such as "
          "v3:16x16 or v4:4x4x4")
    generation, grid = GENERATIONS[match.group(1)], match.group(2)
    if grid.count("x") != generation.grids[0].count("x"):
      raise errors.InputError(
          f"--topology={name!r}: a {generation.name} chip grid has "
          f"{generation.grids[0].count('x') + 1} sides, such as "
          f"{generation.name}:{generation.grids[-1]}")
    slice_name = generation.slice_name(_chips(grid))
  sides = [int(n) for n in grid.split("x")] + [1]
  host = (sides[:3] if _chips(grid) <= generation.host_chips
          else MULTI_HOST_CHIPS)
  try:
    description = topologies.get_topology_desc(
        platform="tpu", topology_name=f"{generation.name}:{grid}",
        chip_config_name=generation.chip_config,
        chips_per_host_bounds=tuple(host), num_slices=1)
  except jax.errors.JaxRuntimeError as e:  # A grid libtpu cannot lay out.
    raise errors.InputError(f"--topology={name!r}: {e}") from e
  return Slice(slice_name, generation, grid, description.devices)


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

  Per device means per JAX device: a v3 core, a chip of the later
  generations. A step that does not fit has the HBM the compiler found it
  needs, and no estimate (None; null in JSON): plan it again once it fits.
  """
  topology: str               # the slice's accelerator type
  generation: str             # GENERATIONS' key: v3, v4, v5p, v5e, v6e
  chips: int
  devices: int
  hosts: int
  mesh: dict
  batch_size: int
  accum_steps: int
  fits: bool                  # the compiler's verdict
  hbm_argument_bytes: int     # params, optimizer state, batch (per device)
  hbm_temp_bytes: int         # activations, gradients, workspace
  hbm_bytes_per_device: int   # all of it, code and unaliased outputs too
  hbm_capacity_bytes: int     # the device's HBM
  flops_per_device_per_step: float | None      # the compiler's count
  model_flops_per_device_per_step: float       # compute.flops_per_image's
  peak_flops_per_device: float                 # bfloat16
  estimated_step_seconds: float | None
  total_steps: int
  overhead: float
  compile_seconds: float       # the step as configured
  cost_compile_seconds: float  # its twins' without loops, if it has loops
  suggestions: list

  @property
  def mfu(self):
    """Model FLOPs (no recomputation counted) over the devices' peak."""
    if self.estimated_step_seconds is None:
      return None
    return (self.model_flops_per_device_per_step
            / (self.estimated_step_seconds * self.peak_flops_per_device))

  @property
  def train_chip_hours(self):
    if self.estimated_step_seconds is None:
      return None
    return (self.total_steps * self.estimated_step_seconds * self.chips
            / SECONDS_PER_HOUR)

  @property
  def predicted_chip_hours(self):
    hours = self.train_chip_hours
    return None if hours is None else hours * (1 + self.overhead)

  @property
  def train_core_days(self):
    return self._core_days(self.train_chip_hours)

  @property
  def predicted_core_days(self):
    return self._core_days(self.predicted_chip_hours)

  def _core_days(self, chip_hours):
    """TPUv3-core-days, the paper's unit: of a v3 plan only."""
    if self.generation != "v3" or chip_hours is None:
      return None
    return (chip_hours * GENERATIONS["v3"].cores_per_chip * SECONDS_PER_HOUR
            / compute.SECONDS_PER_DAY)

  def to_json(self):
    out = {**dataclasses.asdict(self), "mfu": self.mfu,
           "train_chip_hours": self.train_chip_hours,
           "predicted_chip_hours": self.predicted_chip_hours}
    if self.generation == "v3":  # Its cores are its devices, and its unit.
      out.update(
          cores=self.devices, hbm_bytes_per_core=self.hbm_bytes_per_device,
          flops_per_core_per_step=self.flops_per_device_per_step,
          model_flops_per_core_per_step=self.model_flops_per_device_per_step,
          train_core_days=self.train_core_days,
          predicted_core_days=self.predicted_core_days)
    return out


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
  """The bytes per device that XLA's out-of-HBM error reports, or None for
  another error. Its "G" is GiB, its "T" TiB."""
  if "RESOURCE_EXHAUSTED" not in message:
    return None
  match = (re.search(r"\(([\d.]+)([KMGT])\) exceeds available HBM", message)
           or re.search(r"Used ([\d.]+)([KMGT]) of", message))
  if not match:
    return 0
  size, unit = match.groups()
  return int(float(size) * 2**(10 * ("KMGT".index(unit) + 1)))


def bytes_per_device(shapes):
  """What a tree of sharded ShapeDtypeStructs holds on one device."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(shapes))


def step_cost(compiled):
  """{flops, optimal_seconds} of a compiled step, as XLA's cost model has
  them for one device."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost  # Older JAX: a list.
  # libtpu's cost model has no time for its ConcatBitcast custom calls (on
  # v4, v5e and v6e: asynchronously copied slices that lie side by side,
  # read as one buffer) and adds -1 s for each; they move no data: 0 s.
  unknown = compiled.as_text().count('custom_call_target="ConcatBitcast"')
  seconds = float(cost["optimal_seconds"]) + unknown
  if seconds <= 0:
    raise RuntimeError(f"the compiler's step time estimate is {seconds} s")
  return {"flops": float(cost["flops"]), "optimal_seconds": seconds}


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
      costs[num_layers, micro_batches] = step_cost(compiled)

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
  return plan_slice(config, topology(topology_name), classes, overhead)


def compare(config, topology_names, classes=0, overhead=DEFAULT_OVERHEAD):
  """`plan` on each slice, every slice checked before the first compile."""
  slices = [topology(name) for name in topology_names]
  problems = []
  for tpu_slice in slices:
    try:
      check_layout(config, tpu_slice)
    except errors.ConfigError as e:
      problems.append(str(e))
  if problems:
    raise errors.ConfigError("\n".join(problems))
  return [plan_slice(config, s, classes, overhead) for s in slices]


def check_layout(config, tpu_slice):
  """A ConfigError unless config.mesh can be laid out on the slice's chips.

  (sharding.MeshLayoutError: fsdp=8 has no place on v4-128's 4x4x4
  chips, nor on v6e-256's 16x16.) The message names the fsdp sizes that
  can be, with the other axes as they are.
  """
  def lays_out(mesh):
    try:
      sharding.make_mesh(mesh, tpu_slice.devices)
    except sharding.MeshLayoutError:
      return False
    return True

  if lays_out(config.mesh):
    return
  fits = []
  for fsdp in (2**k for k in range(len(tpu_slice.devices).bit_length())):
    try:
      if lays_out({**config.mesh, "fsdp": fsdp}):
        fits.append(str(fsdp))
    except ValueError:  # The other axes leave no room for it.
      pass
  raise errors.ConfigError(
      f"config.mesh {sharding.describe_mesh(config.mesh)} cannot be laid out "
      f"on {tpu_slice.name}'s {tpu_slice.grid} chips: each mesh axis must "
      "span whole sides of them"
      + (f"; --config.mesh.fsdp of {', '.join(fits)} would be"
         if fits else ""))


def plan_slice(config, tpu_slice, classes, overhead):
  check_layout(config, tpu_slice)
  devices, generation = tpu_slice.devices, tpu_slice.generation
  classes = num_classes(config, classes)
  program, batch = build_step(config, devices, classes)
  compiled, needed, seconds = compile_step(program, batch)
  cost, cost_seconds = None, 0.0  # No estimate for a step that cannot run.
  if compiled is None:  # The compiler stops at the temporaries it cannot place.
    arguments = bytes_per_device((program.state_shapes, batch))
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
      cost = step_cost(compiled)
  model_flops = compute.flops_per_image(
      config.model, config.image_size, train=True,
      num_classes=classes) * config.batch_size / len(devices)
  result = Plan(
      topology=tpu_slice.name, generation=generation.name,
      chips=tpu_slice.chips, devices=len(devices), hosts=tpu_slice.hosts,
      mesh=dict(program.batch_sharding.mesh.shape),
      batch_size=config.batch_size, accum_steps=config.accum_steps,
      fits=compiled is not None, hbm_argument_bytes=int(arguments),
      hbm_temp_bytes=int(temporaries), hbm_bytes_per_device=int(hbm),
      hbm_capacity_bytes=generation.hbm_bytes,
      flops_per_device_per_step=cost and cost["flops"],
      model_flops_per_device_per_step=float(model_flops),
      peak_flops_per_device=generation.peak_flops,
      estimated_step_seconds=cost and cost["optimal_seconds"],
      total_steps=int(config.total_steps), overhead=overhead,
      compile_seconds=seconds, cost_compile_seconds=cost_seconds,
      suggestions=[])
  if not result.fits:
    result.suggestions = suggestions(config, result)
  return result


def suggestions(config, result):
  """What would bring a plan that does not fit under the device's HBM, each
  with the estimate that makes it a candidate; `plan` again to be sure."""
  out = []
  args, temp = result.hbm_argument_bytes, result.hbm_temp_bytes
  mesh = result.mesh
  per_device_batch = config.batch_size // (mesh["data"] * mesh["fsdp"])
  if mesh["fsdp"] == 1:
    fsdp = min(16, mesh["data"])
    out.append(
        f"--config.mesh.fsdp={fsdp}: params and optimizer state split "
        f"{fsdp} ways instead of copied on every device ({args / GiB:.1f} "
        f"GiB of arguments now, about {args / fsdp / GiB:.1f} GiB then)")
  if not config.model.remat_policy:
    out.append(
        "--config.model.remat_policy=nothing_saveable: the backward pass "
        "recomputes each block, so only the blocks' inputs are kept "
        f"({temp / GiB:.1f} GiB of temporaries now; costs about a third "
        "more FLOPs); dots_with_no_batch_dims_saveable keeps the matmuls' "
        "outputs and recomputes less")
  if per_device_batch % (2 * config.accum_steps) == 0:
    accum = 2 * config.accum_steps
    out.append(
        f"--config.accum_steps={accum}: {per_device_batch // accum} images "
        f"per device at a time instead of "
        f"{per_device_batch // config.accum_steps}, about halving the "
        "activations, at the same batch")
  if not config.model.scan_layers:
    out.append("--config.model.scan_layers=True with a remat_policy: one "
               "compiled block for all layers, keeping what the policy saves "
               "(without remat, a scan keeps more than unrolled layers do)")
  slices = list(GENERATIONS[result.generation].slices)
  if result.topology in slices[:-1]:
    out.append(f"--topology={slices[slices.index(result.topology) + 1]}: "
               "fewer images per device")
  return out


def describe(config_name, result):
  """The plan as the lines a person reads."""
  mesh = sharding.describe_mesh(result.mesh)
  per_device = result.batch_size / result.devices
  capacity = result.hbm_capacity_bytes / GiB
  verdict = ("fits" if result.fits else
             "DOES NOT FIT (the compiler stopped at the temporaries)")
  lines = [
      f"{config_name} on TPU {result.topology}: {_plural(result.chips, 'chip')}"
      f" as {_plural(result.devices, 'device')}, "
      f"{_plural(result.hosts, 'host')}",
      f"  mesh          {mesh}; batch {result.batch_size}, {per_device:g} "
      f"per device" + (f", {result.accum_steps} micro-batches"
                       if result.accum_steps > 1 else ""),
      f"  HBM           {result.hbm_argument_bytes / GiB:.2f} GiB arguments "
      f"+ {result.hbm_temp_bytes / GiB:.2f} GiB temporaries = "
      f"{result.hbm_bytes_per_device / GiB:.2f} GiB per device of "
      f"{capacity:.0f}: {verdict}"]
  if result.estimated_step_seconds is None:
    lines.append("  step time     no estimate until it fits")
  else:
    hours = result.predicted_chip_hours
    lines += [
        f"  FLOPs         {result.flops_per_device_per_step:.3g} per device "
        f"per step (compiler's count); the model's matmuls "
        f"{result.model_flops_per_device_per_step:.3g}",
        f"  step time     {result.estimated_step_seconds:.4g} s (compiler's "
        f"estimate): MFU {result.mfu:.1%} of "
        f"{result.peak_flops_per_device / 1e12:.1f} TFLOP/s per device",
        f"  steps         {result.total_steps:,}",
        f"  chip-hours    {_number(result.train_chip_hours)} training + "
        f"{result.overhead:.0%} for evaluation, checkpoints and restarts = "
        f"{_number(hours)} ({_number(hours / result.chips)} hours on "
        f"{result.chips} chips)"]
    if result.predicted_core_days is not None:
      lines.append(f"  core-days     {_number(result.predicted_core_days)} "
                   "TPUv3-core-days (the paper's unit)")
  lines.append(
      f"  compiled in   {result.compile_seconds:.0f} s" + (
          f", and {result.cost_compile_seconds:.0f} s for the estimate "
          "(its twins without loops)" if result.cost_compile_seconds
          else ""))
  if result.suggestions:
    lines.append("  to make it fit, try:")
    lines.extend(f"    {s}" for s in result.suggestions)
  return "\n".join(lines)


def describe_comparison(config_name, results):
  """Plans of one config on several slices as one table."""
  header = ("slice", "chips", "hosts", "mesh", "per device",
            "HBM per device", "MFU", "step time", "chip-hours",
            "TPUv3-core-days")
  rows = [header]
  for r in results:
    estimated = r.estimated_step_seconds is not None
    rows.append((
        r.topology, f"{r.chips:,}", f"{r.hosts:,}",
        "x".join(str(n) for n in r.mesh.values()),
        f"{r.batch_size / r.devices:g}",
        f"{r.hbm_bytes_per_device / GiB:.1f} of "
        f"{r.hbm_capacity_bytes / GiB:.0f} GiB"
        + ("" if r.fits else " DOES NOT FIT"),
        f"{r.mfu:.0%}" if estimated else "-",
        f"{r.estimated_step_seconds:.3g} s" if estimated else "-",
        _number(r.predicted_chip_hours) if estimated else "-",
        "-" if r.predicted_core_days is None
        else _number(r.predicted_core_days)))
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  lines = [f"{config_name}: batch {results[0].batch_size}, "
           f"{results[0].total_steps:,} steps; mesh is data x fsdp x model; "
           f"chip-hours and core-days include "
           f"{results[0].overhead:.0%} for evaluation, checkpoints and "
           "restarts"]
  lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)
                      ).rstrip() for row in rows]
  for r in results:
    if r.suggestions:
      lines.append(f"{r.topology} does not fit; try: "
                   + "; ".join(s.split(":")[0] for s in r.suggestions))
  return "\n".join(lines)


def _plural(n, noun):
  return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _number(x):
  return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
