"""The TPU generations and slices a config can be planned for.

Each Generation knows its HBM per JAX device, bf16 peak, chips per host and
slice sizes; `topology` turns a slice name (v3-256, v5p-128, v6e-64,
tpu7x-128, or a chip grid such as v4:4x4x8), and a number of such slices
joined by the data-center network (DCN), into the devices libtpu compiles
for, and `check_layout` refuses a mesh the slice's torus cannot lay out.
"""

import dataclasses
import math
import re

import jax
from jax.experimental import topologies

from vit_jax import errors, sharding
from vit_jax.training import throughput

GiB = 2**30


SECONDS_PER_HOUR = 3_600


@dataclasses.dataclass(frozen=True)
class Generation:
  """A TPU generation: what Cloud TPU rents and libtpu compiles for.

  A slice is named `{accelerator}-N`, N its TensorCores (chips x
  cores_per_chip): Cloud TPU counts v2 to v5p and TPU7x slices in cores,
  v5e and v6e slices in chips, which have one core each, so N is both.
  """
  name: str              # its short name, libtpu's prefix: v5e:4x4
  accelerator: str       # the accelerator type's prefix: v5litepod-16
  chip_config: str       # libtpu's; "megacore" shows a chip's 2 cores as 1
  device_kind: str       # what JAX calls its devices
  cores_per_chip: int
  hbm_bytes: int         # per JAX device
  hbm_bandwidth: float   # bytes/s per JAX device, the data sheet's
  host_chips: int        # a slice of up to this many chips is one host
  grids: tuple           # the slices Cloud TPU offers, as chip grids

  @property
  def peak_flops(self):
    """bfloat16 FLOP/s per JAX device."""
    return throughput.PEAK_FLOPS_PER_DEVICE[self.device_kind]

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
# slice is one VM of 8. HBM bandwidth per chip, from the same pages: v3
# 900 GB/s, v4 1,200, v5p 2,765, v5e 819, v6e 1,640, TPU7x 7,380; split
# between the devices of a chip where each core is one.
GENERATIONS = {generation.name: generation for generation in (
    # 2 cores per chip, each its own JAX device with 16 GiB of the chip's
    # 32; a 2-D torus of up to 1,024 chips.
    Generation("v3", "v3", "default", "TPU v3", 2, 16 * GiB, 450e9, 4,
               ("2x2", "4x4", "4x8", "8x8", "8x16", "16x16", "16x32",
                "32x32")),
    # 2 cores per chip that JAX drives as one device (megacore), 32 GiB;
    # 3-D slices of up to 2,048 chips here (a pod has 4,096).
    Generation("v4", "v4", "megacore", "TPU v4", 2, 32 * GiB, 1_200e9, 4,
               ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8",
                "4x8x8", "8x8x8", "8x8x12", "8x8x16", "8x16x16")),
    # Megacore too, 95 GiB per chip; its common 3-D shapes up to the
    # largest single slice, 6,144 chips (others: a chip grid).
    Generation("v5p", "v5p", "megacore", "TPU v5", 2, 95 * GiB, 2_765e9,
               4,
               ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8",
                "4x8x8", "8x8x8", "8x8x16", "8x16x16", "16x16x16",
                "16x16x24")),
    # One core per chip, 16 GiB; a 2-D torus of up to 256 chips.
    Generation("v5e", "v5litepod", "default", "TPU v5 lite", 1, 16 * GiB,
               819e9, 8,
               ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    # Trillium: one core per chip, 32 GiB; up to 256 chips.
    Generation("v6e", "v6e", "default", "TPU v6 lite", 1, 32 * GiB,
               1_640e9, 8,
               ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")),
    # Ironwood: 2 cores per chip, each its own JAX device (no megacore)
    # with 96 GiB of the chip's 192; 4 chips per VM; 3-D slices up to the
    # whole pod of 9,216 chips. Slices are named by cores, as xpk names
    # them: tpu7x-8 is one VM of 2x2x1 chips (docs/plan.md).
    Generation("tpu7x", "tpu7x", "default", "TPU7x", 2, 96 * GiB, 3_690e9,
               4,
               ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8",
                "4x8x8", "8x8x8", "8x8x16", "8x16x16", "16x16x16",
                "16x16x24", "16x24x24")),
)}


# Published measured runs over this project's plan of their configs (its
# predicted chip-hours, the overhead included), each derived in
# docs/plan.md: the paper's Table 2 TPUv3-core-days over the plans of
# configs/table2/pretrain.py, and big_vision's S/16 run (about 6.5 hours on
# a v3-8) over the plan of configs/imagenet/plain.py:S/16,90.
MEASURED_OVER_PLANNED = {
    "Table 2, ViT-H/14 on JFT-300M": 2_500 / 1_191.0,
    "Table 2, ViT-L/16 on JFT-300M": 680 / 410.7,
    "Table 2, ViT-L/16 on ImageNet-21k": 230 / 125.2,
    "big_vision, S/16 on ImageNet-1k": 6.5 * 4 / 13.8,
}
# What a run may expect to take, as multiples of the plan's prediction.
EXPECTED_OVER_PLANNED = (min(MEASURED_OVER_PLANNED.values()),
                         max(MEASURED_OVER_PLANNED.values()))

# Data-center network (DCN) bandwidth per chip, in bits per second, where
# Cloud TPU publishes it: the v5p page's table (50 Gbps per chip), and
# v5e's two 100 Gbps NICs per host of 8 chips (its page's 6.4 Tbps per
# 256-chip pod is the same 25 Gbps per chip). Elsewhere a plan over several
# slices takes the figure from --dcn_gbps_per_chip.
DCN_BITS_PER_CHIP = {"v5p": 50e9, "v5e": 25e9}


# Accelerator-type prefixes: each generation's, and v5e's short name.
ACCELERATORS = {**{g.accelerator: g for g in GENERATIONS.values()},
                "v5e": GENERATIONS["v5e"]}


MULTI_HOST_CHIPS = (2, 2, 1)  # The hosts of a multi-host slice.


def describe(name, slices):
  """v4-128, or 2 x v5p-1024: `slices` slices of type `name`."""
  return name if slices == 1 else f"{slices} x {name}"


def _chips(grid):
  return math.prod(int(n) for n in grid.split("x"))


@dataclasses.dataclass
class Slice:
  """TPU slices as libtpu describes them: devices to compile for, not run
  on; `slices` of them, alike, joined by DCN."""
  name: str              # its accelerator type: v4-128
  generation: Generation
  grid: str              # each slice's chips: 4x4x4
  devices: list          # of all the slices
  slices: int = 1

  @property
  def chips(self):
    return _chips(self.grid) * self.slices

  @property
  def description(self):
    return describe(self.name, self.slices)

  @property
  def hosts(self):
    return len({device.process_index for device in self.devices})


def topology(name, slices=1):
  """A Cloud TPU accelerator type ('v4-128') or a generation's chip grid
  ('v4:4x4x4', for a shape not in its `grids`), and how many such slices
  work together -> their Slice."""
  if slices < 1:
    raise errors.InputError(f"--slices={slices}: give 1 or more")
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
      names = ", ".join(
          f"{g.accelerator}-N" + "".join(
              f" (or {alias}-N)" for alias, same in ACCELERATORS.items()
              if same is g and alias != g.accelerator)
          for g in GENERATIONS.values())
      raise errors.InputError(
          f"--topology={name!r}: expected a Cloud TPU slice, {names}, such "
          "as v3-512 or v4-128, or a chip grid such as v3:16x16 or v4:4x4x4")
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
        chips_per_host_bounds=tuple(host), num_slices=slices)
  except jax.errors.JaxRuntimeError as e:  # A grid libtpu cannot lay out.
    raise errors.InputError(f"--topology={name!r}: {e}") from e
  return Slice(slice_name, generation, grid, description.devices, slices)


def check_layout(mesh, tpu_slice):
  """A ConfigError unless `mesh` (the Settings' config.mesh) can be laid
  out on the slice's chips.

  (sharding.MeshLayoutError: fsdp=8 has no place on v4-128's 4x4x4
  chips, nor on v6e-256's 16x16.) The message names the fsdp sizes that
  can be, with the other axes as they are.
  """
  def lays_out(sizes):
    try:
      sharding.make_mesh(sizes, tpu_slice.devices)
    except sharding.MeshLayoutError:
      return False
    return True

  sizes = dataclasses.asdict(mesh)
  if lays_out(sizes):
    return
  fits = []
  for fsdp in (2**k for k in range(len(tpu_slice.devices).bit_length())):
    try:
      if lays_out({**sizes, "fsdp": fsdp}):
        fits.append(str(fsdp))
    except errors.InputError:  # The other axes leave no room for it.
      pass
  raise errors.ConfigError(
      f"config.mesh {sharding.describe_mesh(sizes)} cannot be laid out "
      f"on {tpu_slice.description}'s {tpu_slice.grid} chips: each mesh axis must "
      "span whole sides of them"
      + (f"; --config.mesh.fsdp of {', '.join(fits)} would be"
         if fits else ""))
