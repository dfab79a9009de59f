"""Compiled programs are kept between runs (JAX's persistent compilation
cache): where --compilation_cache says, and not at all when it is ''."""

import contextlib
import glob
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
from jax.experimental.compilation_cache import compilation_cache

from tests.util import REPO, call_tool, main_flags

# Compiles one program, on an array of the shape argv[2] ("64,61"), in a
# fresh process with the cache in argv[1]; prints how many compiled
# programs it loaded from the cache.
COMPILE_ONCE = """
import sys
from vit_jax import runtime
runtime.use_compilation_cache(sys.argv[1])
import jax, jax.numpy as jnp
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits")
    else None)
shape = tuple(int(n) for n in sys.argv[2].split(","))
jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones(shape)).block_until_ready()
print(len(hits))
"""


def cache_hits(directory, shape):
  # A process of its own: what a second process loads from the cache that a
  # first one left, with nothing compiled in it before.
  done = subprocess.run([sys.executable, "-c", COMPILE_ONCE, directory,
                         ",".join(map(str, shape))],
                        cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return int(done.stdout.split()[-1])


def test_a_second_process_loads_the_program_instead_of_compiling(tmp_path):
  directory = str(tmp_path / "cache")
  hits = []

  def counted(event, **_):
    if event.endswith("cache_hits"):
      hits.append(event)
  # The first compile, in this process and into a cache of its own.
  jax.monitoring.register_event_listener(counted)
  try:
    with cache_opened_anew(), jax_config(
        jax_enable_compilation_cache=True,
        jax_compilation_cache_dir=directory):
      # A program not compiled before in this process: a shape of its own.
      jax.jit(lambda x: jnp.sin(x) @ x.T)(
          jnp.ones((64, 61))).block_until_ready()
  finally:
    jax.monitoring.unregister_event_listener(counted)
  assert not hits and os.listdir(directory)
  # The jitted function and the small programs around it (jnp.ones).
  assert cache_hits(directory, (64, 61)) >= 1


@contextlib.contextmanager
def jax_config(**values):
  """JAX's settings `values` in the block, the earlier ones after it."""
  earlier = {name: getattr(jax.config, name) for name in values}
  try:
    for name, value in values.items():
      jax.config.update(name, value)
    yield
  finally:
    for name, value in earlier.items():
      jax.config.update(name, value)


@contextlib.contextmanager
def cache_opened_anew():
  """JAX opens its persistent cache once in a process, where the first
  program compiles: closed before the block, for the cache that the tool
  sets to be the one opened, as in a process of the tool's, and after it,
  for this process's own to be opened again."""
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    compilation_cache.reset_cache()


def test_main_keeps_its_train_step_where_the_flag_says(digits_data_dir,
                                                       tmp_path):
  directory = tmp_path / "cache"
  args = main_flags(str(tmp_path / "run"), digits_data_dir,
                    total_steps=2, **{"optimizer.warmup_steps": 1})
  with cache_opened_anew():
    code, _, stderr = call_tool(
        "main", *args, f"--compilation_cache={directory}")
  assert code == 0, stderr[-3000:]
  assert glob.glob(str(directory / "jit_train_step-*"))


def test_an_empty_flag_turns_the_cache_off(digits_data_dir, tmp_path,
                                           monkeypatch):
  # Not even JAX's own variable is used then: JAX reads it once, as it is
  # imported, into the setting that this process's JAX is given here.
  env = tmp_path / "env"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(env))
  args = main_flags(str(tmp_path / "run"), digits_data_dir,
                    total_steps=2, **{"optimizer.warmup_steps": 1,
                                      # A program of its own.
                                      "model.hidden_size": 24})
  with cache_opened_anew(), jax_config(jax_compilation_cache_dir=str(env)):
    code, _, stderr = call_tool("main", *args, "--compilation_cache=")
  assert code == 0, stderr[-3000:]
  assert not os.path.exists(env) or not os.listdir(env)
