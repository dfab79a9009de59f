"""The settings that make XLA:CPU's train step faster, set by default.

Measured with benchmarks/train_step.py and explained with
benchmarks/profile_step.py (README, "Speed on CPU"):

- Transparent huge pages. XLA:CPU allocates one temp buffer per executed
  step (about 2 GB for Ti/16 at 224 px, batch 32) and frees it after.
  glibc's malloc serves a block that large with a fresh mmap, so every step
  first-touched about half a million 4 KiB pages: 1.6 s of kernel time per
  3.8 s step. glibc's `hugetlb=1` tunable makes malloc ask for 2 MiB pages,
  which cuts those faults about 400-fold. glibc reads its tunables once, when
  a process starts, so the command re-executes itself with it set.
- Eigen for every matmul and XLA's own code for reductions
  (`--xla_cpu_use_xnnpack=false --xla_cpu_experimental_ynn_fusion_type=`).
  XNNPACK's kernels ran the step's dots, most of them next to another dot
  or a transposed operand, slower than Eigen's (B/16: 16.1 -> 13.4 s per
  step), though a lone square matmul is a little faster with XNNPACK. Even
  so, XLA:CPU handed about half of the dots, the layer norms' sums and the
  softmax's max to YNNPACK, XNNPACK's successor, by default; with none of
  them there, B/16's step fell from 17.0 to 15.7 s in an A/B in one process.
- One CPU device per core (`--xla_force_host_platform_device_count`, the
  largest power of two not above the cores this process may use). With one
  device, XLA:CPU splits each op over the cores, and the step's many small
  ops and its memory-bound passes keep them waiting on one another. With a
  device per core, the batch is split over the data axis of the mesh and
  each core runs its own share of the step (B/16: 18.8 -> 15.1 s). A power
  of two so that the usual batch sizes divide among the devices; on a TPU
  or GPU host this only shapes the unused CPU backend.

None changes what is computed beyond float32 rounding (another matmul
kernel, or a batch split over devices, sums in another order). A flag or
tunable the user set wins; VIT_JAX_CPU_DEFAULTS=0 leaves the process exactly
as started.
"""

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
# XLA flags for the matmul and reduction kernels: name -> value.
KERNEL_FLAGS = {"--xla_cpu_use_xnnpack": "false",
                "--xla_cpu_experimental_ynn_fusion_type": ""}
DEVICES_FLAG = "--xla_force_host_platform_device_count"
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_possible():
  """True on Linux with glibc and transparent huge pages not turned off."""
  if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
    return False
  try:
    with open(_THP_SETTING) as f:
      return "[never]" not in f.read()
  except OSError:
    return False


def cpu_device_count():
  """The largest power of two not above the cores this process may use."""
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count() or 1)
  return 1 << (cores.bit_length() - 1)


def kernel_flags(xla_flags):
  """KERNEL_FLAGS that the XLA_FLAGS string `xla_flags` does not set."""
  return " ".join(f"{name}={value}" for name, value in KERNEL_FLAGS.items()
                  if name not in xla_flags)


def apply():
  """Adds KERNEL_FLAGS and DEVICES_FLAG to XLA_FLAGS unless set there, and
  re-executes with TUNABLE if needed.

  Call it first thing in a `__main__` block, before JAX is imported,
  anything is printed or any thread is started.
  """
  if os.environ.get("VIT_JAX_CPU_DEFAULTS") == "0":
    return
  xla_flags = os.environ.get("XLA_FLAGS", "")
  xla_flags = f"{xla_flags} {kernel_flags(xla_flags)}"
  if DEVICES_FLAG not in xla_flags:
    xla_flags = f"{xla_flags} {DEVICES_FLAG}={cpu_device_count()}"
  os.environ["XLA_FLAGS"] = xla_flags.strip()
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  if TUNABLE in tunables.split(":") or not huge_pages_possible():
    return
  os.environ["GLIBC_TUNABLES"] = ":".join(
      part for part in (tunables, TUNABLE) if part)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(sys.executable, sys.orig_argv)
