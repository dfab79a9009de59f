"""Transparent huge pages for the host memory of XLA:CPU's train step.

XLA:CPU allocates one temp buffer per executed step (about 2 GB for Ti/16 at
224 px, batch 32) and frees it after. glibc's malloc serves a block that
large with a fresh mmap, so every step first-touches about half a million
4 KiB pages: on the machine of issue 11 that was 1.6 s of kernel time per
3.8 s step. With glibc's `hugetlb=1` tunable malloc asks for transparent huge
pages (2 MiB), which cuts those page faults about 400-fold. The tunable is
read once when a process starts, so a command-line entry point re-executes
itself with it set; nothing else about the process changes.
"""

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
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


def use_huge_pages():
  """Re-executes this command with TUNABLE added to GLIBC_TUNABLES.

  Call it first thing in a `__main__` block, before anything is printed or
  any thread is started. Returns (without re-executing) when the tunable is
  already set, when huge pages cannot help here, or when
  VIT_JAX_HUGE_PAGES=0 asks for the process as it is.
  """
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  if (TUNABLE in tunables.split(":")
      or os.environ.get("VIT_JAX_HUGE_PAGES") == "0"
      or not huge_pages_possible()):
    return
  env = dict(os.environ, GLIBC_TUNABLES=":".join(
      part for part in (tunables, TUNABLE) if part))
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, env)
