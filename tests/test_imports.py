"""Importing a vit_jax module changes nothing outside it: the settings of a
process are made by the tools' entry points (vit_jax/cli/), not by an
import in a notebook. And each module imports only from its own floor of the
package or below (FLOORS, below)."""

import ast
import graphlib
import json
import os
import pathlib
import subprocess
import sys

from tests.util import REPO
from vit_jax import runtime

# The commands users type, each a `python -m vit_jax.X`.
COMMANDS = {"main", "plan", "export", "predict", "figures", "vtab",
            "branch", "convert_dataset"}
# The package's floors, lowest first: a module may import modules on its own
# floor or below. A module of a wing package (vit_jax/<wing>/...) is on that
# wing's floor.
FLOORS = [
    {"errors", "paths", "runtime", "serving", "sharding"},
    {"models"},
    {"data"},
    {"runs"},
    {"weights"},
    {"training"},
    {"analysis"},
    {"planning"},
    {"cli", *COMMANDS},
]
PACKAGE = pathlib.Path(REPO) / "vit_jax"

# In a fresh interpreter: the libraries first, so that only vit_jax's own
# effect is compared; then every vit_jax module, one at a time, each
# compared with the state before it (what a module imports is imported
# first, so a change is charged to the first module that makes it).
SCRIPT = r"""
import importlib, json, logging, os, pkgutil, sys, threading, warnings

import absl.flags, absl.logging, clu.parameter_overview, flax.linen
import grain  # Defines absl flags of its own (and array_record's).
import jax, jax.numpy, matplotlib, ml_collections.config_flags, optax
import orbax.checkpoint as ocp, scipy.ndimage, sklearn.datasets
import tensorflow, tensorflow_datasets
from tensorflow_datasets.core import registered
import vit_jax


def tfds_registry():
  # What registering a TFDS builder (or collection) writes: its name.
  return sorted([*registered._DATASET_REGISTRY,
                 *registered._ABSTRACT_DATASET_REGISTRY,
                 *registered._DATASET_COLLECTION_REGISTRY,
                 *registered._ABSTRACT_DATASET_COLLECTION_REGISTRY,
                 len(registered._DATASET_PROVIDER_REGISTRY)], key=str)


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
      "stderr": id(sys.stderr),
      "unraisable hook": id(sys.unraisablehook),
      "tfds registry": tfds_registry(),
  }


FLAGS = absl.flags.FLAGS
before, changed, flags_defined = state(), {}, {}
for module in pkgutil.walk_packages(vit_jax.__path__, "vit_jax."):
  defined = set(FLAGS)
  importlib.import_module(module.name)
  # A command defines its flags when imported, as absl tools do; they are
  # its own, and go before the next command defines its --workdir.
  if set(FLAGS) - defined:
    flags_defined[module.name] = sorted(set(FLAGS) - defined)
  for name in set(FLAGS) - defined:
    delattr(FLAGS, name)
  after = state()
  if after != before:
    changed[module.name] = sorted(k for k in after if after[k] != before[k])
    before = after
print(json.dumps({"changed": changed, "flags": flags_defined,
                  "tfds registry": [str(name) for name in tfds_registry()]}))
"""


def test_importing_vit_jax_changes_nothing_outside_it():
  # Without the settings that the tests' own process made, so that a module
  # setting one of them would show.
  env = {name: value for name, value in os.environ.items()
         if name not in {**runtime.AHEAD_OF_TIME, **runtime.QUIET_ENVIRONMENT}}
  done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  found = json.loads(done.stdout.splitlines()[-1])
  # Environment, TFDS registry, log levels, ...: each module that changed
  # one, with what it changed.
  assert found["changed"] == {}
  # vit_jax.data.sources looks its own builders up: TFDS never hears of them.
  assert "digits" not in found["tfds registry"]
  # Only the command line defines flags: the commands and cli's --verbose.
  assert set(found["flags"]) <= {f"vit_jax.{name}" for name in
                                 {"cli", *COMMANDS}}, found["flags"]


# Imports every command, as its `python -m` does (each one's flags taken
# away before the next defines its own), and prints what of TensorFlow that
# loaded.
COMMANDS_SCRIPT = r"""
import importlib, json, sys
import absl.flags
for name in sys.argv[1:]:
  defined = set(absl.flags.FLAGS)
  importlib.import_module(f"vit_jax.{name}")
  for flag in set(absl.flags.FLAGS) - defined:
    delattr(absl.flags.FLAGS, flag)
print(json.dumps(sorted(m for m in sys.modules
                        if m.partition(".")[0] == "tensorflow")))
"""


def test_the_commands_start_without_tensorflow():
  # Only reading data needs it (data/lazy_tensorflow.py): the tools that
  # read none, and a mistake found before the data is read, start seconds
  # sooner without it.
  done = subprocess.run([sys.executable, "-c", COMMANDS_SCRIPT,
                         *sorted(COMMANDS)], cwd=REPO, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads(done.stdout.splitlines()[-1]) == []


def modules():
  """Every module of the package: dotted name -> its file."""
  found = {}
  for path in PACKAGE.rglob("*.py"):
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts.pop()
    found[".".join(parts)] = path
  return found


def imports(name, path, known):
  """The vit_jax modules that module `name` imports anywhere in its file
  (inside functions too): [(module, line)]."""
  def module_of(dotted):  # `from a.b import c`: module a.b.c, or a.b.
    while dotted not in known and "." in dotted:
      dotted = dotted.rsplit(".", 1)[0]
    return dotted

  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [(module_of(alias.name), node.lineno) for alias in node.names
                if alias.name.split(".")[0] == "vit_jax"]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # Relative: from the package, up level - 1.
        parent = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parent + ([node.module] if node.module else []))
      if base.split(".")[0] == "vit_jax":
        found += [(module_of(f"{base}.{alias.name}"), node.lineno)
                  for alias in node.names]
  return found


def floor(module):
  """The floor of a vit_jax module (its wing's, for a wing's module); None
  for one of no floor, -1 for the package itself."""
  parts = module.split(".")
  if len(parts) == 1:
    return -1
  return next((i for i, names in enumerate(FLOORS) if parts[1] in names),
              None)


def test_modules_import_only_their_floor_and_below():
  known = modules()
  unplaced = sorted(name for name in known if floor(name) is None)
  assert not unplaced, f"modules on no floor (FLOORS): {unplaced}"
  upward = [
      f"{known[name].relative_to(REPO)}:{line}: {name} (floor "
      f"{floor(name)}) imports {target} (floor {floor(target)})"
      for name, path in sorted(known.items())
      for target, line in imports(name, path, known)
      if floor(target) > floor(name)]
  assert not upward, "\n".join(upward)


def test_no_import_cycles():
  known = modules()
  graph = {name: {target for target, _ in imports(name, path, known)
                  if target != name}
           for name, path in known.items()}
  try:
    graphlib.TopologicalSorter(graph).prepare()
  except graphlib.CycleError as e:
    raise AssertionError(f"an import cycle: {' -> '.join(e.args[1])}") from e


def test_the_floor_check_sees_every_form_of_import(tmp_path):
  """A check that finds nothing must be one that would have."""
  (tmp_path / "vit_jax" / "data").mkdir(parents=True)
  module = tmp_path / "vit_jax" / "data" / "late.py"
  module.write_text(
      "import vit_jax.training.step\n"
      "from vit_jax import cli\n"
      "from vit_jax.weights import npz\n"
      "def later():\n"
      "  from ..planning import cost\n"
      "  from . import pipeline\n")
  known = {name: None for name in (
      "vit_jax.training.step", "vit_jax.cli", "vit_jax.weights.npz",
      "vit_jax.weights", "vit_jax.planning.cost", "vit_jax.data.pipeline")}
  found = imports("vit_jax.data.late", module, known)
  assert sorted(found) == [
      ("vit_jax.cli", 2), ("vit_jax.data.pipeline", 6),
      ("vit_jax.planning.cost", 5), ("vit_jax.training.step", 1),
      ("vit_jax.weights.npz", 3)]
  assert [floor(target) > floor("vit_jax.data.late")
          for target, _ in sorted(found)] == [True, False, True, True, True]
