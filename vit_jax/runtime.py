"""A process's runtime settings, decided here and nowhere else.

The entry points (vit_jax/cli/ for every tool, tests/conftest.py, the
Makefile, the benchmarks) apply them; importing any vit_jax module sets
none. `prepare` is what a tool does first, before JAX or TensorFlow loads:
quiet libraries (QUIET_ENVIRONMENT, unless --verbose), TensorFlow without
Keras (LEAN_TENSORFLOW), the CPU as JAX's
platform on a host with no TPU or GPU (else libtpu, installed with the
`tpu` extra, probes for chips and logs its failure), and the CPU defaults
(`apply`): TCMalloc, or glibc's malloc keeping freed memory in huge pages;
YNNPACK for the dots; one CPU device per core. They make XLA:CPU's train
step faster; docs/speed_on_cpu.md has the measurements behind each. None
changes what is computed beyond float32 rounding (another matmul kernel, or
a batch split over devices, sums in another order). A setting of the
user's wins; VIT_JAX_CPU_DEFAULTS=0 leaves the process exactly as started.

A process that trains then calls `prepare_to_train` (TensorFlow off the
accelerators, the input pipeline's heap, the pod's processes joined);
`compile_ahead_of_time` serves vit_jax.plan.
"""

import ctypes
import ctypes.util
import glob
import os
import platform
import sys

# Environment variables that silence the C++ side of the libraries; each is
# read when its library loads, hence set before any import. A value the user
# set wins.
QUIET_ENVIRONMENT = {
    "TF_CPP_MIN_LOG_LEVEL": "3",   # TensorFlow and XLA (also absl's pre-init
                                   # warning, which only a first log prints).
    "TPU_MIN_LOG_LEVEL": "3",      # libtpu.
    "TPU_STDERR_LOG_LEVEL": "3",
    "GRPC_VERBOSITY": "ERROR",
    "TF_ENABLE_ONEDNN_OPTS": "0",  # Its notice, and TF computes no model here.
}
# TensorFlow imports the whole of Keras 3 as it loads (and scikit-learn with
# it), which slows every tool's start (docs/speed_on_cpu.md); told to use
# Keras 2 instead, it imports that only where installed (tf_keras, which
# vit_jax does not install). Nothing in vit_jax uses Keras. Set in every
# tool, quiet or not.
LEAN_TENSORFLOW = {"TF_USE_LEGACY_KERAS": "1"}
# The allocator where JAX computes on the CPU: XLA:CPU allocates each step's
# temp buffers afresh and frees them after, and under that glibc's heap
# keeps growing, each step that grows it faulting its new pages in
# (docs/speed_on_cpu.md).
TCMALLOC = "tcmalloc_minimal"
# TCMalloc's environment: freed memory kept for reuse, and no report on
# stderr of every step buffer over 1 GiB.
TCMALLOC_SETTINGS = {"TCMALLOC_RELEASE_RATE": "0",
                     "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}
# Without TCMalloc: 2 MiB pages, for far fewer faults on a step's first touch
# of its buffers.
HUGE_PAGES = {"glibc.malloc.hugetlb": "1"}
# glibc malloc tunables that keep freed memory in the heap: name -> value.
# One arena, so that XLA's threads allocate in the heap that is kept; only
# where JAX computes on the CPU, as on a TPU or GPU host the step buffers
# are not in this heap and many input threads would contend for the arena.
KEEP_MEMORY = {"glibc.malloc.arena_max": "1", "glibc.malloc.mmap_max": "0",
               "glibc.malloc.trim_threshold": str(1 << 40)}
# XLA flags for the matmul and reduction kernels: name -> value. YNNPACK
# for the dots it takes (both operands row-major), Eigen for the other dots,
# XLA's own code for the reductions (which YNNPACK's default would take
# too), no XNNPACK: the fastest step (docs/speed_on_cpu.md).
KERNEL_FLAGS = {"--xla_cpu_use_xnnpack": "false",
                "--xla_cpu_experimental_ynn_fusion_type":
                    "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
DEVICES_FLAG = "--xla_force_host_platform_device_count"
# Where the tools that train keep XLA's compiled programs between runs
# (JAX's persistent compilation cache), unless --compilation_cache or
# JAX_COMPILATION_CACHE_DIR names another place. JAX keeps there only
# programs that took at least a second to compile.
DEFAULT_COMPILATION_CACHE = "~/.cache/vit_jax/compilation"
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
# Device nodes of TPUs (v2-v4: accel, v5 and later: vfio), which JAX's own
# TPU detection looks for too, and of NVIDIA GPUs.
_TPU_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*")
_ACCELERATOR_NODES = (*_TPU_NODES, "/dev/nvidia[0-9]*")


# For compiling ahead of time for a TPU slice (vit_jax.plan): this host's CPU
# executes and libtpu only compiles. Without these, JAX would look for TPU
# chips and the GCE metadata server, and libtpu would log errors for the
# local TPU host it cannot find; none changes what is compiled for the slice.
# libtpu locks /tmp/libtpu_lockfile against a second process using the chips;
# compiling uses none, so plans (and tests) may run side by side.
AHEAD_OF_TIME = {"JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1",
                 "TPU_ACCELERATOR_TYPE": "v3-8",
                 "TPU_WORKER_HOSTNAMES": "localhost",
                 "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def prepare(verbose=False):
  """A tool's settings, before JAX, TensorFlow or any thread starts (see the
  module docstring); may re-execute the command."""
  for name, value in LEAN_TENSORFLOW.items():
    os.environ.setdefault(name, value)
  if not verbose:
    for name, value in QUIET_ENVIRONMENT.items():
      os.environ.setdefault(name, value)
  if "JAX_PLATFORMS" not in os.environ and not accelerator_nodes():
    os.environ["JAX_PLATFORMS"] = "cpu"
  apply()


def hide_accelerators_from_tensorflow():
  """TensorFlow only feeds data: it must take no TPU or GPU memory from JAX.
  A host without them leaves TensorFlow unimported until data is read."""
  if not accelerator_nodes():
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], "GPU")
  tf.config.set_visible_devices([], "TPU")


def keep_freed_memory():
  """Has glibc keep freed blocks of up to 32 MiB in the heap.

  By default glibc maps each block over 128 KiB (a decoded crop, a resized
  image) from the OS and unmaps it when freed, so the next one page-faults
  all its memory in again: a large share of the input pipeline's CPU time.
  32 MiB is glibc's largest mmap threshold. Elsewhere than glibc, nothing;
  nor where GLIBC_TUNABLES already sets the trim threshold (`apply` keeps
  the whole heap on a CPU host, and this lower threshold would hand its
  freed step buffers back to the OS).
  """
  if "glibc.malloc.trim_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
    return
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return
  m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
  libc.mallopt(m_mmap_threshold, 32 << 20)
  libc.mallopt(m_trim_threshold, 256 << 20)


def prepare_to_train(distributed="auto", coordinator_address=None,
                     num_processes=None, process_id=None,
                     compilation_cache=None, verbose=False):
  """What a process that trains does after `prepare`: accelerators for JAX
  alone, the input pipeline's heap kept, compiled programs kept between
  runs, and the pod's processes joined."""
  hide_accelerators_from_tensorflow()
  keep_freed_memory()
  use_compilation_cache(compilation_cache)
  join_pod(distributed, coordinator_address, num_processes, process_id,
           verbose)


def use_compilation_cache(directory=None):
  """JAX's persistent compilation cache in `directory`: a restart, a
  resume or a second run of the same program loads its compiled step
  instead of compiling it again. None: JAX_COMPILATION_CACHE_DIR if set,
  else DEFAULT_COMPILATION_CACHE; "": off. A gs:// path serves a pod's
  hosts from one bucket. Returns the directory used, or None."""
  import jax  # pylint: disable=g-import-not-at-top
  if directory is None:
    directory = os.environ.get("JAX_COMPILATION_CACHE_DIR",
                               DEFAULT_COMPILATION_CACHE)
  if not directory:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  if "://" not in directory:
    directory = os.path.abspath(os.path.expanduser(directory))
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", directory)
  return directory


def join_pod(mode="auto", coordinator_address=None, num_processes=None,
             process_id=None, verbose=False):
  """Initialises jax.distributed, before JAX touches a device.

  mode "auto" joins when a coordinator is given (several processes on one
  machine, as launch/local_pod.sh starts them) or on a Cloud TPU VM, whose
  slice JAX describes by itself; "on" and "off" decide outright.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  wanted = {"on": True, "off": False}.get(
      mode, bool(coordinator_address) or on_tpu_host())
  if not wanted:
    return
  if "cpu" in (jax.config.jax_platforms, os.environ.get("JAX_PLATFORMS")):
    # Collectives across CPU processes (the emulated pod) go through gloo.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if not verbose:
      native_stdout_to_null()
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes,
                             process_id=process_id)
  logging.info("Process %d of %d, %d of %d devices local",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def native_stdout_to_null():
  """Python's prints keep the terminal; what native code writes to file
  descriptor 1 goes nowhere (children started from here inherit that).

  For gloo alone: it prints a line per device and peer as a CPU pod's
  processes connect, from several threads at once, interleaved, with
  std::cout (tcp::Context::printConnectivityInfo), which no setting or
  log level turns off.
  """
  sys.stdout.flush()
  terminal = os.dup(1)
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 1)
  os.close(null)
  sys.stdout = os.fdopen(terminal, "w", buffering=1)


def compile_ahead_of_time():
  """Sets AHEAD_OF_TIME, each unless set; call it before JAX is imported."""
  for name, value in AHEAD_OF_TIME.items():
    os.environ.setdefault(name, value)


def glibc_linux():
  """True where GLIBC_TUNABLES means something."""
  return sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def huge_pages_possible():
  """True on Linux with glibc and transparent huge pages not turned off."""
  if not glibc_linux():
    return False
  try:
    with open(_THP_SETTING) as f:
      return "[never]" not in f.read()
  except OSError:
    return False


def cpu_device_count():
  """The largest power of two not above the cores this process may use.

  A device per core runs its own share of the batch, where one device
  splits each op over the cores; a power of two, so that the usual batch
  sizes divide among the devices.
  """
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count() or 1)
  return 1 << (cores.bit_length() - 1)


def accelerator_nodes(patterns=_ACCELERATOR_NODES):
  """The device files of this host's TPU chips and NVIDIA GPUs."""
  return [node for pattern in patterns for node in glob.glob(pattern)]


def on_tpu_host():
  """True on a Cloud TPU VM: the host has TPU chips' device files."""
  return bool(accelerator_nodes(_TPU_NODES))


def computes_on_cpu():
  """True if JAX will run the step on the CPU: JAX_PLATFORMS names the CPU
  first or, unset, this host has no TPU or GPU device node."""
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  return not accelerator_nodes()


def glibc_tunables(tunables):
  """The GLIBC_TUNABLES string `tunables` with this host's defaults added,
  each unless `tunables` sets it."""
  wanted = {}
  if huge_pages_possible():
    wanted.update(HUGE_PAGES)
  if glibc_linux() and computes_on_cpu():
    wanted.update(KEEP_MEMORY)
  parts = [part for part in tunables.split(":") if part]
  named = {part.split("=")[0] for part in parts}
  parts += [f"{name}={value}" for name, value in wanted.items()
            if name not in named]
  return ":".join(parts)


def tcmalloc_library():
  """The name of TCMalloc's shared library on this host, or None."""
  return ctypes.util.find_library(TCMALLOC)


def allocator_environment():
  """The allocator's environment variables for this process: name -> value.

  TCMalloc where JAX computes on the CPU and the host has it, unless
  LD_PRELOAD loads something else; else glibc's tunables. A variable the
  user set keeps its value (GLIBC_TUNABLES: each tunable).
  """
  if not glibc_linux():
    return {}
  preload = os.environ.get("LD_PRELOAD", "")
  if computes_on_cpu() and (TCMALLOC in preload or not preload):
    library = preload or tcmalloc_library()
    if library:
      return {"LD_PRELOAD": library, **{
          name: os.environ.get(name, value)
          for name, value in TCMALLOC_SETTINGS.items()}}
  return {"GLIBC_TUNABLES": glibc_tunables(
      os.environ.get("GLIBC_TUNABLES", ""))}


def kernel_flags(xla_flags):
  """KERNEL_FLAGS that the XLA_FLAGS string `xla_flags` does not set."""
  return " ".join(f"{name}={value}" for name, value in KERNEL_FLAGS.items()
                  if name not in xla_flags)


def apply():
  """Where the CPU computes, adds KERNEL_FLAGS and DEVICES_FLAG to XLA_FLAGS
  unless set there; re-executes with `allocator_environment` if it changes
  the environment.

  Call it first thing in a `__main__` block, before JAX is imported,
  anything is printed or any thread is started: the loader reads LD_PRELOAD
  and glibc its tunables only when a process starts.
  """
  if os.environ.get("VIT_JAX_CPU_DEFAULTS") == "0":
    return
  # XLA:CPU's flags only where the CPU computes: a GPU's jaxlib may be
  # another XLA, which stops at a flag it does not know.
  if computes_on_cpu():
    xla_flags = os.environ.get("XLA_FLAGS", "")
    xla_flags = f"{xla_flags} {kernel_flags(xla_flags)}"
    if DEVICES_FLAG not in xla_flags:
      xla_flags = f"{xla_flags} {DEVICES_FLAG}={cpu_device_count()}"
    os.environ["XLA_FLAGS"] = xla_flags.strip()
  wanted = allocator_environment()
  if all(os.environ.get(name, "") == value
         for name, value in wanted.items()):
    return
  os.environ.update(wanted)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(sys.executable, sys.orig_argv)
