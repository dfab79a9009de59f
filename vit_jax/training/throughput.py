"""What the devices do per second: FLOP/s and MFU of the train step, against
each device kind's peak (a data sheet's, or on a CPU a matmul timed here);
core-days."""

import functools
import time

import jax
import jax.numpy as jnp
from absl import logging

SECONDS_PER_DAY = 86_400  # Of a core-day: a device busy for 24 hours.

# Dense bfloat16 peak per JAX device (a TPU v2/v3 core; a v4/v5p chip, whose
# two cores JAX shows as one device; a v5e/v6e chip; a GPU), from the
# vendors' data sheets. The NVIDIA figures quoted below are TFLOP/s with
# sparsity, twice the dense rate that a ViT's matmuls can reach.
# A device takes the longest name found in its device_kind ("NVIDIA H100
# PCIe" is an "H100 PCIe", "NVIDIA H100 80GB HBM3" an "H100").
PEAK_FLOPS_PER_DEVICE = {
    "TPU v2": 22.5e12,       # 45 TFLOP/s per chip, 2 cores.
    "TPU v3": 61.5e12,       # 123 TFLOP/s per chip, 2 cores.
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,   # v5e.
    "TPU v5p": 459e12,
    "TPU v5": 459e12,        # v5p, as some runtimes name it.
    "TPU v6 lite": 918e12,   # v6e (Trillium).
    "TPU7x": 1153.5e12,      # Ironwood: 2,307 TFLOP/s per chip, 2 cores.
    "A100": 312e12,          # A100 sheet: 624 sparse, SXM and PCIe alike.
    "H100": 989e12,          # H100 sheet: SXM, 1,979 sparse.
    "H100 PCIe": 756e12,     # H100 sheet: 1,513 sparse.
    "H100 NVL": 835e12,      # H100 sheet: 1,671 sparse.
    "H200": 989e12,          # H200 sheet: SXM, 1,979 sparse (H100's compute).
    "H200 NVL": 835e12,      # H200 sheet: 1,671 sparse.
    "B200": 2.25e15,         # HGX B200 sheet: 4.5 PFLOP/s sparse per GPU.
}


def peak_flops_per_device(device=None):
  """(peak FLOP/s, where it comes from) of one device of this kind.

  A CPU has no table entry: a large float32 matmul is timed once, and the
  rate is shared among the devices the host emulates.
  """
  device = device or jax.devices()[0]
  kinds = [kind for kind in PEAK_FLOPS_PER_DEVICE
           if kind in device.device_kind]
  if kinds:
    kind = max(kinds, key=len)  # "TPU v5 lite", not "TPU v5".
    return PEAK_FLOPS_PER_DEVICE[kind], f"{kind} data sheet, bfloat16 dense"
  if device.platform == "cpu":
    return (measured_matmul_flops() / jax.local_device_count(),
            f"measured: a float32 matmul on this host's CPUs, shared by "
            f"{jax.local_device_count()} devices")
  return None, f"unknown device kind {device.device_kind!r}"


# Kernels XLA:CPU can run a lone dot with: Eigen's and YNNPACK's, whatever
# the process's flags choose. The best of them is taken as the machine's
# rate, so that a setting which slows the lone dot cannot flatter a ratio
# to it.
_MATMUL_KERNELS = ({"xla_cpu_experimental_ynn_fusion_type": ""},
                   {"xla_cpu_experimental_ynn_fusion_type":
                    "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"})


class MatmulRate:
  """A size x size float32 matmul on one CPU device, compiled with each of
  _MATMUL_KERNELS that this XLA has; `measure` times it."""

  def __init__(self, size):
    self.size = size
    self.operand = jax.device_put(jnp.ones((size, size), jnp.float32),
                                  jax.devices("cpu")[0])
    self.programs = []
    for options in _MATMUL_KERNELS:
      try:
        program = jax.jit(jnp.dot).lower(self.operand, self.operand).compile(
            compiler_options=options)
      except jax.errors.JaxRuntimeError:
        continue  # An XLA without that option: its other kernels count.
      program(self.operand, self.operand).block_until_ready()
      self.programs.append(program)

  def measure(self, repeats=1):
    """FLOP/s of the fastest of `repeats` runs with each kernel."""
    best = float("inf")
    for program in self.programs:
      for _ in range(repeats):
        start = time.perf_counter()
        program(self.operand, self.operand).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * self.size**3 / best


@functools.cache
def measured_matmul_flops(size=1024, repeats=3):
  """MatmulRate(size).measure(repeats), once per process."""
  return MatmulRate(size).measure(repeats)


class Throughput:
  """Turns img/s per device into TFLOP/s per device and MFU for the log."""

  def __init__(self, flops_per_image, batch_size):
    """`flops_per_image`: a training step's per image, as the run's
    objective counts them (a packed run's "images" here are its
    sequences)."""
    self.flops_per_image = flops_per_image
    self.flops_per_step = self.flops_per_image * batch_size
    self.peak = None

  def metrics(self, img_per_sec_per_device):
    if self.peak is None:  # At the first log: a CPU's is measured.
      self.peak, source = peak_flops_per_device()
      logging.info("%.3g FLOPs per training step; peak %s FLOP/s per device "
                   "(%s)", self.flops_per_step,
                   "unknown" if self.peak is None else f"{self.peak:.3g}",
                   source)
      self.peak = self.peak or 0.0
    flops = img_per_sec_per_device * self.flops_per_image
    row = {"flops_per_step": float(self.flops_per_step),
           "tflops_per_sec_per_device": flops / 1e12}
    if self.peak:
      row["mfu"] = flops / self.peak
    return row
