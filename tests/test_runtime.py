"""The XLA:CPU defaults of vit_jax.main and the benchmarks."""

import os
import subprocess
import sys

import pytest

from vit_jax import runtime

PROGRAM = ("import os; from vit_jax import runtime; "
           "print('started', flush=True); runtime.apply(); "
           "print(os.environ.get('GLIBC_TUNABLES')); "
           "print(os.environ.get('XLA_FLAGS')); "
           "print(os.environ.get('LD_PRELOAD')); "
           "print(os.environ.get('TCMALLOC_RELEASE_RATE'))")


# Frees a touched 256 MiB block in a thread, as XLA:CPU frees a step's temp
# buffer, then prints the page faults of touching a second one.
FAULTS_PROGRAM = """
import ctypes, resource, threading
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
def step():
  block = libc.malloc(size)
  ctypes.memset(block, 1, size)
  libc.free(block)
def faults():
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
thread = threading.Thread(target=step)
thread.start(); thread.join()
before = faults()
thread = threading.Thread(target=step)
thread.start(); thread.join()
print(faults() - before)
"""
# At least this many faults to refill the block in huge pages.
PAGES = (256 << 20) // (2 << 20)
TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:"
            "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776")
TCMALLOC = runtime.tcmalloc_library()
# Preloaded in place of TCMalloc: a library that is not an allocator.
NOT_AN_ALLOCATOR = "libm.so.6"
needs_huge_pages = pytest.mark.skipif(
    not runtime.huge_pages_possible(),
    reason="no glibc or transparent huge pages here")


def run(program=PROGRAM, **env):
  # A process of its own: runtime.apply re-executes the process, and the
  # loader and glibc read LD_PRELOAD and GLIBC_TUNABLES only as one starts.
  environment = {k: v for k, v in os.environ.items() if k not in (
      "GLIBC_TUNABLES", "XLA_FLAGS", "VIT_JAX_CPU_DEFAULTS", "LD_PRELOAD",
      *runtime.TCMALLOC_SETTINGS)}
  environment.update(env)
  out = subprocess.run([sys.executable, "-c", program], env=environment,
                       capture_output=True, text=True, check=True).stdout
  return out.split("\n")[:-1]


def stand_in_tcmalloc(folder):
  """A library named as TCMalloc that is not one (this process's libm, by
  another name in `folder`), for hosts without TCMalloc: what is tested is
  runtime's choice of the library and the re-execution, not the allocator."""
  with open("/proc/self/maps") as maps:
    (libm,) = {line.split()[-1] for line in maps
               if os.path.basename(line.split()[-1]).startswith("libm.so")}
  path = os.path.join(folder, "libtcmalloc_minimal.so.4")
  os.symlink(libm, path)
  return path


# The host's TCMalloc where it has one, else a stand-in by its name.
@pytest.mark.parametrize("library", [
    "host's" if runtime.glibc_linux() and TCMALLOC else "stand-in"])
def test_the_command_runs_again_with_tcmalloc_and_the_flags(library,
                                                            tmp_path):
  program = PROGRAM
  if library == "stand-in":
    preloaded = stand_in_tcmalloc(tmp_path)
    program = (f"from vit_jax import runtime; "
               f"runtime.tcmalloc_library = lambda: {preloaded!r}; {PROGRAM}")
  else:
    # The host's TCMalloc, run again into, keeps a freed step buffer too
    # (in this process rather than another: the suite's processes are few).
    preloaded = TCMALLOC
    program = f"{PROGRAM}\n{FAULTS_PROGRAM}"
  devices = f"{runtime.DEVICES_FLAG}={runtime.cpu_device_count()}"
  out = run(program, JAX_PLATFORMS="cpu")
  # "started" is printed once before the re-execution and once after it.
  assert out[:6] == [
      "started", "started", "None",
      f"{runtime.kernel_flags('')} {devices}", preloaded, "0"]
  if library == "host's":
    assert int(out[6]) < PAGES // 10
  else:
    assert len(out) == 6


def test_the_users_own_settings_go_into_the_run_again(monkeypatch, tmp_path):
  # In this process: the run again itself is the test above's.
  preloaded = stand_in_tcmalloc(tmp_path)
  monkeypatch.setattr(runtime, "tcmalloc_library", lambda: preloaded)
  assert applied_again(
      monkeypatch, JAX_PLATFORMS="cpu", TCMALLOC_RELEASE_RATE="1",
      XLA_FLAGS="--xla_force_host_platform_device_count=8") == [
          None, f"--xla_force_host_platform_device_count=8 "
          f"{runtime.kernel_flags('')}", preloaded, "1"]


@needs_huge_pages
def test_without_tcmalloc_glibc_gets_the_tunables(monkeypatch):
  out = run(JAX_PLATFORMS="cpu", LD_PRELOAD=NOT_AN_ALLOCATOR)
  assert out[:3] == ["started", "started", TUNABLES]
  assert out[4:] == [NOT_AN_ALLOCATOR, "None"]
  # The user's own tunables come first (in this process: the run again is
  # the one above's).
  assert applied_again(monkeypatch, JAX_PLATFORMS="cpu",
                       LD_PRELOAD=NOT_AN_ALLOCATOR,
                       GLIBC_TUNABLES="glibc.malloc.trim_threshold=1")[0] == (
                           "glibc.malloc.trim_threshold=1:"
                           "glibc.malloc.hugetlb=1:glibc.malloc.arena_max=1:"
                           "glibc.malloc.mmap_max=0")


@needs_huge_pages
def test_memory_is_kept_only_where_jax_computes_on_the_cpu(monkeypatch):
  monkeypatch.delenv("LD_PRELOAD", raising=False)
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  monkeypatch.setattr(runtime, "tcmalloc_library",
                      lambda: "libtcmalloc_minimal.so.4")
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")
  assert runtime.allocator_environment() == {
      "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(runtime.glob, "glob",
                      lambda pattern: ["/dev/accel0"] if "accel" in pattern
                      else [])
  assert runtime.allocator_environment() == {
      "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
  monkeypatch.setattr(runtime.glob, "glob", lambda pattern: [])
  assert runtime.allocator_environment() == {
      "LD_PRELOAD": "libtcmalloc_minimal.so.4",
      **runtime.TCMALLOC_SETTINGS}
  monkeypatch.setattr(runtime, "tcmalloc_library", lambda: None)
  assert runtime.allocator_environment() == {"GLIBC_TUNABLES": TUNABLES}


# A process for each of two malloc settings (glibc reads them as it
# starts).
@pytest.mark.processes(2)
@needs_huge_pages
def test_a_freed_buffer_is_reused_without_page_faults():
  # With glibc's tunables (the host's TCMalloc: the test above).
  assert int(run(FAULTS_PROGRAM, GLIBC_TUNABLES="glibc.malloc.hugetlb=1")[0]) \
      >= PAGES
  assert int(run(FAULTS_PROGRAM, GLIBC_TUNABLES=TUNABLES)[0]) < PAGES // 10


@needs_huge_pages
def test_the_input_pipeline_keeps_the_heap_that_the_tunables_keep():
  """Its own malloc settings (for TPU hosts) would hand a freed step buffer
  back to the OS."""
  program = ("from vit_jax import runtime; "
             "runtime.keep_freed_memory()\n" + FAULTS_PROGRAM)
  assert int(run(program, GLIBC_TUNABLES=TUNABLES)[-1]) < PAGES // 10


@pytest.mark.parametrize("cores, devices", [(1, 1), (2, 2), (6, 4), (16, 16)])
def test_one_device_per_core_in_a_power_of_two(monkeypatch, cores, devices):
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)),
                      raising=False)
  assert runtime.cpu_device_count() == devices


def applied(monkeypatch, execv=None, **env):
  """runtime.apply() called in this process with the environment of `run`'s
  program: the four variables that PROGRAM prints, each None where unset,
  after it. Where it would run the process again (os.execv) the test fails:
  these cases are those where it must not. A copy of the environment: what
  it sets stays out of this process's."""
  monkeypatch.setattr(os, "environ", dict(os.environ))
  for name in ("GLIBC_TUNABLES", "XLA_FLAGS", "VIT_JAX_CPU_DEFAULTS",
               "LD_PRELOAD", *runtime.TCMALLOC_SETTINGS):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)

  def ran_again(*args):
    raise AssertionError(f"runtime.apply ran the process again: {args}")
  monkeypatch.setattr(runtime.os, "execv", execv or ran_again)
  runtime.apply()
  return [os.environ.get(name) for name in (
      "GLIBC_TUNABLES", "XLA_FLAGS", "LD_PRELOAD", "TCMALLOC_RELEASE_RATE")]


class RanAgain(Exception):
  """runtime.apply's os.execv, with the environment the process would
  start again with."""


def applied_again(monkeypatch, **env):
  """`applied`'s four variables as the process would start again with them,
  where runtime.apply runs it again; the test fails where it would not."""
  def execv(*args):
    raise RanAgain(dict(os.environ))
  with pytest.raises(RanAgain) as again:
    applied(monkeypatch, execv=execv, **env)
  environment = again.value.args[0]
  return [environment.get(name) for name in (
      "GLIBC_TUNABLES", "XLA_FLAGS", "LD_PRELOAD", "TCMALLOC_RELEASE_RATE")]


def test_what_the_user_set_wins_and_no_second_run_when_set(monkeypatch):
  own = ("--xla_cpu_use_xnnpack=true "
         "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE "
         "--xla_force_host_platform_device_count=1")
  mine = ("glibc.malloc.hugetlb=0:glibc.malloc.arena_max=8:"
          "glibc.malloc.mmap_max=1:glibc.malloc.trim_threshold=1")
  assert applied(monkeypatch, JAX_PLATFORMS="cpu", GLIBC_TUNABLES=mine,
                 XLA_FLAGS=own, LD_PRELOAD=NOT_AN_ALLOCATOR)[:2] == [mine, own]
  # One flag of the user's leaves the others to be added.
  assert applied(monkeypatch, JAX_PLATFORMS="cpu", GLIBC_TUNABLES=TUNABLES,
                 LD_PRELOAD=NOT_AN_ALLOCATOR,
                 XLA_FLAGS="--xla_cpu_use_xnnpack=true")[1].split() == [
                     "--xla_cpu_use_xnnpack=true",
                     "--xla_cpu_experimental_ynn_fusion_type="
                     "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
                     f"{runtime.DEVICES_FLAG}="
                     f"{runtime.cpu_device_count()}"]
  assert applied(monkeypatch, VIT_JAX_CPU_DEFAULTS="0") == [None] * 4


def test_no_cpu_flags_where_an_accelerator_computes(monkeypatch):
  """A GPU's jaxlib may be another XLA that stops at a CPU flag it does not
  know: XLA_FLAGS stays as the user set it."""
  out = applied(monkeypatch, JAX_PLATFORMS="cuda", GLIBC_TUNABLES=TUNABLES,
                LD_PRELOAD=NOT_AN_ALLOCATOR)
  assert out[:2] == [TUNABLES, None]
  out = applied(monkeypatch, JAX_PLATFORMS="tpu", GLIBC_TUNABLES=TUNABLES,
                LD_PRELOAD=NOT_AN_ALLOCATOR, XLA_FLAGS="--xla_dump_to=/tmp/x")
  assert out[:2] == [TUNABLES, "--xla_dump_to=/tmp/x"]
