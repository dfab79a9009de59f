"""Importing a vit_jax module changes nothing outside it: the settings of a
process are made by the tools' entry points (vit_jax/cli.py), not by an
import in a notebook."""

import json
import os
import subprocess
import sys

from vit_jax import runtime
from tests.util import REPO

# In a fresh interpreter: the libraries first, so that only vit_jax's own
# effect is compared; then every vit_jax module, one at a time, each
# compared with the state before it (what a module imports is imported
# first, so a change is charged to the first module that makes it).
SCRIPT = r"""
import importlib, json, logging, os, pkgutil, sys, threading, warnings

import absl.flags, absl.logging, clu.metric_writers, clu.parameter_overview, flax.linen
import jax, jax.numpy, matplotlib, ml_collections.config_flags, optax
import orbax.checkpoint as ocp, scipy.ndimage, sklearn.datasets
import tensorflow, tensorflow_datasets
import vit_jax


def state():
  return {
      "environment": dict(os.environ),
      "threads": threading.active_count(),
      "root log handlers": [id(h) for h in logging.getLogger().handlers],
      "log levels": [logging.getLogger(name).level
                     for name in ("", "absl", "tensorflow", "jax")],
      "absl verbosity": absl.logging.get_verbosity(),
      "warning filters": len(warnings.filters),
      "orbax array handler": id(
          ocp.type_handlers.get_type_handler(jax.Array)),
      "matplotlib backend": dict.__getitem__(matplotlib.rcParams, "backend"),
      "jax x64": jax.config.jax_enable_x64,
      "stdout": id(sys.stdout),
  }


FLAGS = absl.flags.FLAGS
before, changed = state(), {}
for module in pkgutil.walk_packages(vit_jax.__path__, "vit_jax."):
  defined = set(FLAGS)
  importlib.import_module(module.name)
  # A tool defines its flags when imported, as absl tools do; they are its
  # own, and go before the next tool defines its --workdir.
  for name in set(FLAGS) - defined:
    delattr(FLAGS, name)
  after = state()
  if after != before:
    changed[module.name] = sorted(k for k in after if after[k] != before[k])
    before = after
print(json.dumps(changed))
"""


def test_importing_vit_jax_changes_nothing_outside_it():
  # Without the settings that the tests' own process made, so that a module
  # setting one of them would show.
  env = {name: value for name, value in os.environ.items()
         if name not in {**runtime.AHEAD_OF_TIME, **runtime.QUIET_ENVIRONMENT}}
  done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads(done.stdout.splitlines()[-1]) == {}
