"""The re-execution that gives XLA:CPU's step buffers transparent huge pages."""

import os
import subprocess
import sys

import pytest

from vit_jax import host_memory

PROGRAM = ("import os; from vit_jax import host_memory; "
           "print('started', flush=True); host_memory.use_huge_pages(); "
           "print(os.environ.get('GLIBC_TUNABLES'))")


def run(**env):
  environment = {k: v for k, v in os.environ.items()
                 if k not in ("GLIBC_TUNABLES", "VIT_JAX_HUGE_PAGES")}
  environment.update(env)
  out = subprocess.run([sys.executable, "-c", PROGRAM], env=environment,
                       capture_output=True, text=True, check=True).stdout
  return out.split("\n")[:-1]


@pytest.mark.skipif(not host_memory.huge_pages_possible(),
                    reason="no glibc or transparent huge pages here")
def test_the_command_runs_again_with_the_tunable_added():
  # Printed once before the re-execution and once after it.
  assert run() == ["started", "started", host_memory.TUNABLE]
  assert run(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1") == [
      "started", "started",
      f"glibc.malloc.trim_threshold=1:{host_memory.TUNABLE}"]


def test_no_second_run_when_set_or_declined():
  assert run(GLIBC_TUNABLES=host_memory.TUNABLE) == [
      "started", host_memory.TUNABLE]
  assert run(VIT_JAX_HUGE_PAGES="0") == ["started", "None"]
