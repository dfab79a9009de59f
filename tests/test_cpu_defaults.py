"""The XLA:CPU defaults of vit_jax.main and the benchmarks."""

import os
import subprocess
import sys

import pytest

from vit_jax import cpu_defaults

PROGRAM = ("import os; from vit_jax import cpu_defaults; "
           "print('started', flush=True); cpu_defaults.apply(); "
           "print(os.environ.get('GLIBC_TUNABLES')); "
           "print(os.environ.get('XLA_FLAGS'))")


def run(**env):
  environment = {k: v for k, v in os.environ.items() if k not in (
      "GLIBC_TUNABLES", "XLA_FLAGS", "VIT_JAX_CPU_DEFAULTS")}
  environment.update(env)
  out = subprocess.run([sys.executable, "-c", PROGRAM], env=environment,
                       capture_output=True, text=True, check=True).stdout
  return out.split("\n")[:-1]


@pytest.mark.skipif(not cpu_defaults.huge_pages_possible(),
                    reason="no glibc or transparent huge pages here")
def test_the_command_runs_again_with_the_defaults_added():
  devices = f"{cpu_defaults.DEVICES_FLAG}={cpu_defaults.cpu_device_count()}"
  # "started" is printed once before the re-execution and once after it.
  assert run() == ["started", "started", cpu_defaults.TUNABLE,
                   f"{cpu_defaults.kernel_flags('')} {devices}"]
  assert run(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1",
             XLA_FLAGS="--xla_force_host_platform_device_count=8") == [
                 "started", "started",
                 f"glibc.malloc.trim_threshold=1:{cpu_defaults.TUNABLE}",
                 f"--xla_force_host_platform_device_count=8 "
                 f"{cpu_defaults.kernel_flags('')}"]


@pytest.mark.parametrize("cores, devices", [(1, 1), (2, 2), (6, 4), (16, 16)])
def test_one_device_per_core_in_a_power_of_two(monkeypatch, cores, devices):
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)),
                      raising=False)
  assert cpu_defaults.cpu_device_count() == devices


def test_what_the_user_set_wins_and_no_second_run_when_set():
  own = ("--xla_cpu_use_xnnpack=true "
         "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_REDUCE "
         "--xla_force_host_platform_device_count=1")
  assert run(GLIBC_TUNABLES=cpu_defaults.TUNABLE, XLA_FLAGS=own) == [
      "started", cpu_defaults.TUNABLE, own]
  # One flag of the user's leaves the others to be added.
  assert run(GLIBC_TUNABLES=cpu_defaults.TUNABLE,
             XLA_FLAGS="--xla_cpu_use_xnnpack=true")[2].split() == [
                 "--xla_cpu_use_xnnpack=true",
                 "--xla_cpu_experimental_ynn_fusion_type=",
                 f"{cpu_defaults.DEVICES_FLAG}="
                 f"{cpu_defaults.cpu_device_count()}"]
  assert run(VIT_JAX_CPU_DEFAULTS="0") == ["started", "None", "None"]
