"""What a config will cost on a TPU slice, learned before it is rented.

The config's own train step (training/step.py's `build`: the function and
shardings a run uses) is built from abstract shapes and compiled ahead of
time for the slice by libtpu (`pip install 'vit_jax[tpu]'`) on this host's
CPU: nothing is allocated on a TPU and no data is read. Every Cloud TPU
generation from v3 to TPU7x (catalogue.GENERATIONS) can be planned for. The
compiled program gives:

  - HBM per device: arguments (params, optimizer state, the batch),
    temporaries (activations, gradients) and code, against the device's
    HBM (a v3 core's 16 GiB, a v5p chip's 95 GiB, ...);
  - FLOPs per device per step and the compiler's step-time estimate
    (`optimal_seconds` of its cost model), hence the MFU against the
    device's bfloat16 peak;
  - over several slices, the bytes each device sends over the data-center
    network (DCN) per step (the program's DCN transfers, which XLA's cost
    model does not time) and their time at the generation's DCN bandwidth
    (catalogue.DCN_BITS_PER_CHIP, or one given), added to the step;
  - chip-hours: total steps x step time x chips / 3,600, plus an allowance
    (`overhead`) for evaluation, checkpoints and restarts; on v3 also
    TPUv3-core-days, the paper's unit.

A config that does not fit is told what would make it fit. Planning
takes the config as the run's typed Settings (`settings.of(config)`,
runs/settings.py) and tries its variants with `dataclasses.replace`. The
process must compile for TPUs while it runs on the CPU: its entry point
calls `runtime.compile_ahead_of_time()` first. `python -m vit_jax.plan` is
the command line.
"""

import dataclasses
import math
import re

import jax

from vit_jax import errors, paths, sharding
from vit_jax.data import packing, sources, vtab_tasks
from vit_jax.models import flops as flops_lib
from vit_jax.planning import catalogue, report, work
from vit_jax.training import (
  fitting,
  resolve,
  step as step_lib,
  throughput,
)

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


def num_classes(keys, override=0):
  """The head's class count of the Settings `keys`: `override`, else the
  dataset's (prepared here, a VTAB task, a TFDS catalog entry, or
  UNLISTED_NUM_CLASSES)."""
  if override:
    return override
  data_dir = keys.data_dir
  paths.check_reachable(data_dir, "config.data_dir")
  try:
    return sources.lookup(keys.dataset, data_dir).num_classes
  except errors.InputError:
    pass  # Not prepared on this machine; its size is known elsewhere.
  name = keys.dataset.split(":")[0]
  if keys.dataset.startswith(sources.VTAB_PREFIX):
    return vtab_tasks.get(keys.dataset[len(sources.VTAB_PREFIX):]
                          ).num_classes
  if name in UNLISTED_NUM_CLASSES:
    return UNLISTED_NUM_CLASSES[name]
  if keys.dataset.startswith(sources.CAPTIONS_PREFIX):
    return 0  # Captions, no classes (two towers: no classifier head).
  try:
    import tensorflow_datasets as tfds
    features = tfds.builder(name).info.features
    label = sources.LABEL_FEATURES.get(name, "label")
    if label not in features and any(
        key in features for key in sources.CAPTION_FEATURES):
      return 0
    return features[label].num_classes
  except Exception as e:  # TFDS raises many kinds for an unknown name.
    raise errors.ConfigError(
        f"cannot tell how many classes config.dataset={keys.dataset!r} "
        f"has ({type(e).__name__}: {e}); pass --num_classes") from e


@dataclasses.dataclass
class Plan:
  """What one config costs on one slice; `to_json` is --json's object.

  Per device means per JAX device: a v3 core, a chip of the later
  generations. A step that does not fit has the HBM the compiler found it
  needs, and no estimate (None; null in JSON): plan it again once it fits.
  """
  topology: str                         # the slice's accelerator type
  generation: str             # catalogue.GENERATIONS key: v3, ..., tpu7x
  slices: int                 # of that type, joined by DCN
  chips: int                  # of all the slices
  devices: int
  hosts: int
  mesh: dict
  batch_size: int
  accum_steps: int
  remat_policy: str           # as configured, or as "auto" chose it
  remat_tried: list   # [[policy, temporaries' HBM bytes]] "auto" passed
  fits: bool                  # the compiler's verdict
  hbm_argument_bytes: int     # params, optimizer state, batch (per device)
  hbm_temp_bytes: int         # activations, gradients, workspace
  hbm_bytes_per_device: int   # all of it, code and unaliased outputs too
  hbm_capacity_bytes: int     # the device's HBM
  flops_per_device_per_step: float | None      # the compiler's count
  pallas_kernels: int | None  # custom kernels in the step (model.attention
                              # "splash"), which the compiler cannot see into
  kernel_flops_per_device_per_step: float | None  # theirs, not in its count
  bytes_accessed_per_device_per_step: float | None  # the compiler's count
  model_flops_per_device_per_step: float       # flops_lib.flops_per_image's
  peak_flops_per_device: float                 # bfloat16
  hbm_bandwidth_per_device: float              # bytes/s, the data sheet's
  estimated_step_seconds: float | None  # the compiler's + DCN's
  dcn_bytes_per_device_per_step: float | None  # sent; 0 on one slice
  dcn_bits_per_chip: float | None     # the DCN bandwidth assumed
  dcn_seconds_per_step: float | None  # sending them, a host's chips at once
  work_shares: dict | None   # {kind: share of estimated cycles} (work.py)
  total_steps: int
  overhead: float
  compile_seconds: float       # the step as configured
  cost_compile_seconds: float  # its twins' without loops, if it has loops
  suggestions: list
  # A packed config's {"slots", "images_per_sequence"}: its batch counts
  # sequences (data/packing.py); None for one image a row.
  packing: dict | None = None

  @property
  def description(self):
    return catalogue.describe(self.topology, self.slices)

  @property
  def mfu(self):
    """Model FLOPs (no recomputation counted) over the devices' peak."""
    if self.estimated_step_seconds is None:
      return None
    return (self.model_flops_per_device_per_step
            / (self.estimated_step_seconds * self.peak_flops_per_device))

  @property
  def hbm_seconds(self):
    """The step's HBM traffic at the data sheet's bandwidth: several times
    flops_seconds, and the step is bound by memory (docs/plan.md)."""
    if self.bytes_accessed_per_device_per_step is None:
      return None
    return (self.bytes_accessed_per_device_per_step
            / self.hbm_bandwidth_per_device)

  @property
  def flops_seconds(self):
    """The step's FLOPs (the compiler's count, and its kernels' that the
    compiler does not count) at the bfloat16 peak."""
    if self.flops_per_device_per_step is None:
      return None
    return ((self.flops_per_device_per_step
             + (self.kernel_flops_per_device_per_step or 0))
            / self.peak_flops_per_device)

  @property
  def train_chip_hours(self):
    if self.estimated_step_seconds is None:
      return None
    return (self.total_steps * self.estimated_step_seconds * self.chips
            / catalogue.SECONDS_PER_HOUR)

  @property
  def predicted_chip_hours(self):
    hours = self.train_chip_hours
    return None if hours is None else hours * (1 + self.overhead)

  @property
  def expected_chip_hours(self):
    """[low, high]: the prediction times the least and the most that
    published runs took over their plans
    (catalogue.EXPECTED_OVER_PLANNED); the prediction is the compiler's
    step time, a lower bound."""
    hours = self.predicted_chip_hours
    return None if hours is None else [
        hours * r for r in catalogue.EXPECTED_OVER_PLANNED]

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
    return (chip_hours * catalogue.GENERATIONS["v3"].cores_per_chip *
            catalogue.SECONDS_PER_HOUR / throughput.SECONDS_PER_DAY)

  def to_json(self):
    out = {**dataclasses.asdict(self), "mfu": self.mfu,
           "hbm_seconds": self.hbm_seconds,
           "flops_seconds": self.flops_seconds,
           "train_chip_hours": self.train_chip_hours,
           "predicted_chip_hours": self.predicted_chip_hours,
           "expected_chip_hours": self.expected_chip_hours}
    if self.generation == "v3":  # Its cores are its devices, and its unit.
      out.update(
          cores=self.devices, hbm_bytes_per_core=self.hbm_bytes_per_device,
          flops_per_core_per_step=self.flops_per_device_per_step,
          model_flops_per_core_per_step=self.model_flops_per_device_per_step,
          train_core_days=self.train_core_days,
          predicted_core_days=self.predicted_core_days)
    return out


def build_step(keys, devices, classes, unroll=False, frozen=None):
  """(program, batch shapes) of the step of the Settings `keys` over
  `devices`: checked (vit_jax/training/resolve.py) and built as a run
  builds it, nothing compiled yet where its remat policy is concrete.
  `frozen`: its objective's frozen inputs (a distill.Teacher), where read
  for it already."""
  fitted = resolve.program(keys, devices, classes, frozen)
  program = step_lib.build(fitted.settings, fitted.mesh, fitted.parts, unroll)
  return program, fitting.batch_shapes(
      fitted.settings, fitted.parts.objective, program.batch_sharding)


def bytes_per_device(shapes):
  """What a tree of sharded ShapeDtypeStructs holds on one device."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(shapes))


# The custom calls that libtpu's cost model prices at -1 s each: on v4, v5e
# and v6e ConcatBitcast (asynchronously copied slices that lie side by side,
# read as one buffer); on TPU7x the start and the end of an asynchronous
# call (PrepareAsyncCall*); over several slices ZeroCrop (a DCN transfer's
# padded tiles cut back) and SliceId (docs/plan.md).
UNPRICED_CUSTOM_CALLS = ("ConcatBitcast", "PrepareAsyncCallStart",
                         "PrepareAsyncCallDone", "ZeroCrop", "SliceId")

# A DCN transfer in a multislice program: a send to the runtime that moves
# buffers between slices ("megascale"), with its buffer's type.
DCN_SEND = re.compile(r"= \((\w+)\[([\d,]*)\][^ ]* .*\bsend\(.*"
                      r"_xla_megascale_transfer_type")
BYTES_PER_ELEMENT = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2,
                     "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                     "f64": 8, "s64": 8, "u64": 8}


# step_cost's keys of the estimated cycles of each kind of work.
CYCLES = "cycles:"


# A Pallas kernel compiled for TPUs (Mosaic): libtpu prices it without
# seeing its work and counts none of its FLOPs.
PALLAS_KERNEL = 'custom_call_target="tpu_custom_call"'


def step_cost(compiled):
  """{flops, bytes, optimal_seconds, dcn_bytes, kernels, cycles:KIND...} of
  a compiled step for one device: XLA's cost model's (bytes: what its
  instructions read and write in HBM), the bytes it sends between slices,
  its Pallas kernels and its instructions' estimated cycles by kind of work
  (work.py)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost  # Older JAX: a list.
  # libtpu's cost model has no time for some of its own custom calls and
  # adds -1 s for each; they move no data: 0 s.
  text = compiled.as_text()
  unknown = sum(text.count(f'custom_call_target="{target}"')
                for target in UNPRICED_CUSTOM_CALLS)
  seconds = float(cost["optimal_seconds"]) + unknown
  if seconds <= 0:
    raise RuntimeError(f"the compiler's step time estimate is {seconds} s")
  return {"flops": float(cost["flops"]),
          "bytes": float(cost["bytes accessed"]), "optimal_seconds": seconds,
          "dcn_bytes": float(dcn_bytes(text)),
          "kernels": float(text.count(PALLAS_KERNEL)),
          **{CYCLES + k: float(v) for k, v in work.cycles(text).items()}}


def dcn_bytes(text):
  """The bytes a device sends between slices in a compiled program's text,
  each DCN transfer once."""
  total = 0
  for dtype, dims in DCN_SEND.findall(text):
    total += BYTES_PER_ELEMENT[dtype] * math.prod(
        int(n) for n in dims.split(",") if n)
  return total


def unrolled_cost(keys, devices, classes, frozen=None):
  """({flops, optimal_seconds} or None, compile seconds) of the step of the
  Settings `keys` as if its loops were unrolled.

  XLA's cost analysis counts the body of a loop once, whatever its trip
  count, so a scanned encoder or a micro-batch loop would look cheap; and
  unrolling them all can overflow HBM, which stops the compile. The cost is
  linear in the layers L and in the micro-batches A: twins of the step with
  L in {1, 2} (or all its layers, when not scanned) and A in {1, 2} (or 1),
  each at the same micro-batch and with nothing looped, give it. None when
  a twin does not fit. The twins share `frozen`, the objective's frozen
  inputs (a distilling config's teacher), read once.
  """
  layers = flops_lib.model_sizes(keys.model).config.num_layers
  accum = keys.accum_steps
  micro_batch = keys.batch_size // accum
  layer_points = (1, 2) if keys.model.scan_layers else (layers,)
  accum_points = (1, 2) if accum > 1 else (1,)
  costs, seconds = {}, 0.0
  for num_layers in layer_points:
    for micro_batches in accum_points:
      twin = dataclasses.replace(
          keys, model=dataclasses.replace(keys.model, scan_layers=False,
                                          num_layers=num_layers),
          accum_steps=micro_batches, batch_size=micro_batch * micro_batches)
      compiled, _, took = fitting.compile_step(
          *build_step(twin, devices, classes, unroll=True, frozen=frozen))
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
  if keys.model.scan_layers:
    return extrapolate(per_layers[1], per_layers[2], layers), seconds
  return per_layers[layers], seconds


def plan(keys, topology_name, classes=0, overhead=DEFAULT_OVERHEAD,
         slices=1, dcn_bits_per_chip=None):
  """Compiles the train step of the Settings `keys` for `slices` slices of
  a type and reads its cost."""
  return compare(keys, [topology_name], classes, overhead, slices,
                 dcn_bits_per_chip)[0]


def compare(keys, topology_names, classes=0, overhead=DEFAULT_OVERHEAD,
            slices=1, dcn_bits_per_chip=None):
  """`plan` on each slice, every slice checked before the first compile."""
  tpu_slices = [catalogue.topology(name, slices) for name in topology_names]
  problems, bandwidths = [], []
  for tpu_slice in tpu_slices:
    try:
      catalogue.check_layout(keys.mesh, tpu_slice)
      bandwidths.append(dcn_bandwidth(tpu_slice, dcn_bits_per_chip))
    except errors.InputError as e:
      problems.append(str(e))
  if problems:
    raise errors.ConfigError("\n".join(problems))
  return [plan_slice(keys, s, classes, overhead, bandwidth)
          for s, bandwidth in zip(tpu_slices, bandwidths)]


def cheapest(keys, generation_name, classes=0, overhead=DEFAULT_OVERHEAD,
             say=lambda line: None):
  """(the Settings `keys` planned on each slice of the generation whose
  chips lay out its mesh and share its batch, smallest first; the index of
  the one of fewest expected chip-hours, or None if none fits; "NAME: why"
  of each slice left out). The global batch stays: on a slice where the
  step does not fit, its micro-batches are doubled (accum_steps) until it
  fits or they no longer divide over the devices; a slice whose mesh its
  chips cannot lay out, or whose data-parallel devices the batch does not
  divide over (more micro-batches would not help), is left out before
  anything is compiled. `say` is told of each slice before it is
  compiled."""
  if generation_name not in catalogue.GENERATIONS:
    raise errors.InputError(
        f"unknown TPU generation {generation_name!r}: one of "
        f"{', '.join(catalogue.GENERATIONS)}")
  plans, left_out = [], []
  for name in catalogue.GENERATIONS[generation_name].slices:
    tpu_slice = catalogue.topology(name)
    try:
      catalogue.check_layout(keys.mesh, tpu_slice)
      resolve.check_batch(keys.batch_size, keys.accum_steps,
                          sharding.make_mesh(keys.mesh, tpu_slice.devices))
    except errors.InputError as e:  # Its mesh or batch cannot be here.
      left_out.append(f"{name}: {e}")
      continue
    accum_steps, too_big = keys.accum_steps, None
    while True:
      tried = dataclasses.replace(keys, accum_steps=accum_steps)
      try:
        say(f"trying {name}" + (f" with {accum_steps} micro-batches"
                                  if accum_steps > 1 else ""))
        result = plan_slice(tried, tpu_slice, classes, overhead)
      except errors.InputError as e:  # What else this config cannot do here.
        if too_big:
          plans.append(too_big)
        else:
          left_out.append(f"{name}: {e}")
        break
      if result.fits or accum_steps * 2 > keys.batch_size:
        plans.append(result)
        break
      too_big, accum_steps = result, accum_steps * 2
  if not plans:
    raise errors.ConfigError(
        f"no {generation_name} slice can run this config: "
        + "; ".join(left_out))
  fitting_plans = [i for i, p in enumerate(plans) if p.fits]
  best = min(fitting_plans, key=lambda i: plans[i].predicted_chip_hours,
             default=None)
  return plans, best, left_out


def dcn_bandwidth(tpu_slice, given=None):
  """The DCN bits per second per chip a plan over several slices assumes:
  `given`, else the generation's published figure; None on one slice."""
  if tpu_slice.slices == 1:
    return None
  if given:
    return given
  name = tpu_slice.generation.name
  if name not in catalogue.DCN_BITS_PER_CHIP:
    raise errors.InputError(
        f"{tpu_slice.description}: Cloud TPU publishes no DCN bandwidth for "
        f"{name} (only for {', '.join(catalogue.DCN_BITS_PER_CHIP)}); pass "
        "--dcn_gbps_per_chip")
  return catalogue.DCN_BITS_PER_CHIP[name]


def plan_slice(keys, tpu_slice, classes, overhead, dcn_bits_per_chip=None):
  """One slice's plan of the Settings `keys`, its layout checked by
  `compare` first."""
  devices, generation = tpu_slice.devices, tpu_slice.generation
  classes = num_classes(keys, classes)
  fitted = resolve.program(keys, devices, classes)
  program = fitted.program or step_lib.build(fitted.settings, fitted.mesh,
                                             fitted.parts)
  batch = fitting.batch_shapes(fitted.settings, fitted.parts.objective,
                               program.batch_sharding)
  if fitted.program is None:  # Its remat policy needed no compile to choose.
    compiled, needed, seconds = fitting.compile_step(program, batch)
  else:
    compiled, seconds = fitted.compiled, fitted.seconds
    needed = None if compiled else fitted.tried[-1][1]
  # The twins and the suggestions see the remat policy (and attention)
  # chosen.
  keys = fitted.settings
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
    if keys.model.scan_layers or keys.accum_steps > 1:
      cost, cost_seconds = unrolled_cost(keys, devices, classes,
                                         fitted.parts.objective.frozen)
    else:
      cost = step_cost(compiled)
  num_patches = keys.naflex.max_num_patches or None
  images_per_device = keys.batch_size / len(devices)  # Or sequences.
  packs = packing.Packing.of(keys.naflex)
  model_flops = fitted.parts.objective.flops_per_image(
      keys.image_size, num_patches, packs.slots if packs else 1
  ) * images_per_device
  kernels = cost and round(cost["kernels"])
  kernel_flops = None
  if kernels:  # The splash attention's: the only kernels a model runs.
    kernel_flops = flops_lib.splash_train_flops_per_image(
        program.model, keys.image_size, num_patches) * images_per_device
  step_seconds, dcn_seconds = cost and cost["optimal_seconds"], None
  if cost and dcn_bits_per_chip:
    # A host's devices send at once through its chips' share of DCN.
    devices_per_chip = len(devices) / tpu_slice.chips
    dcn_seconds = (cost["dcn_bytes"] * 8 * devices_per_chip
                   / dcn_bits_per_chip)
    step_seconds += dcn_seconds  # Not overlapped with compute: at most.
  result = Plan(
      topology=tpu_slice.name, generation=generation.name,
      slices=tpu_slice.slices,
      chips=tpu_slice.chips, devices=len(devices), hosts=tpu_slice.hosts,
      mesh=dict(program.batch_sharding.mesh.shape),
      batch_size=keys.batch_size, accum_steps=keys.accum_steps,
      remat_policy=keys.model.remat_policy,
      remat_tried=[list(pair) for pair in fitted.tried],
      fits=compiled is not None, hbm_argument_bytes=int(arguments),
      hbm_temp_bytes=int(temporaries), hbm_bytes_per_device=int(hbm),
      hbm_capacity_bytes=generation.hbm_bytes,
      flops_per_device_per_step=cost and cost["flops"],
      pallas_kernels=kernels,
      kernel_flops_per_device_per_step=kernel_flops,
      bytes_accessed_per_device_per_step=cost and cost["bytes"],
      model_flops_per_device_per_step=float(model_flops),
      peak_flops_per_device=generation.peak_flops,
      hbm_bandwidth_per_device=generation.hbm_bandwidth,
      estimated_step_seconds=step_seconds,
      dcn_bytes_per_device_per_step=cost and cost["dcn_bytes"],
      dcn_bits_per_chip=dcn_bits_per_chip,
      dcn_seconds_per_step=dcn_seconds,
      work_shares=cost and work.shares(
          {k[len(CYCLES):]: v for k, v in cost.items()
           if k.startswith(CYCLES)}),
      total_steps=int(keys.total_steps), overhead=overhead,
      compile_seconds=seconds, cost_compile_seconds=cost_seconds,
      suggestions=[], packing=packs and {
          "slots": packs.slots, "images_per_sequence": packs.per_sequence})
  if not result.fits:
    result.suggestions = report.suggestions(keys, result)
  return result
