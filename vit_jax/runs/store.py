"""A workdir guards its run: a restart must use the config it was started with.

`config.json` in the workdir (read and written by runs/workdir.py) holds
the run's settings. A restart whose settings differ in anything but
CHANGEABLE_KEYS is refused (`differences_allowed`, called by
vit_jax/training/resolve.py) before anything in the workdir is written;
allowed changes are appended to `config_changes.jsonl` and `config.json`
is updated (`record`).
"""

import fnmatch
import math
import time

import jax
from absl import logging

from vit_jax import errors, sharding
from vit_jax.runs import settings

# What may change between restarts of one run, as runs/settings.py marks
# it (and says why): fnmatch patterns of dotted keys.
CHANGEABLE_KEYS = settings.changeable_keys()
# Keys a restart resolves, with the default that a run recorded without
# them holds (runs/settings.py).
RESOLVED_KEYS = settings.resolved_keys()


def differences_allowed(keys, recorded, workdir):
  """Refuses the Settings `keys` unless they are `recorded`, those of the
  run in `workdir` (None: there is none yet), but for CHANGEABLE_KEYS;
  returns those changes."""
  if recorded is None:
    return {}
  changes = differences(recorded, keys)
  refused = {k: v for k, v in changes.items() if not changeable(k)}
  if refused:
    raise errors.ConfigError(refusal(workdir, refused))
  return changes


def changeable(key):
  return any(fnmatch.fnmatchcase(key, pattern) for pattern in CHANGEABLE_KEYS)


def record(keys, workdir, changes):
  """Writes the Settings `keys` as the run's config.json in `workdir`,
  logging `changes` (from `differences_allowed`) to config_changes.jsonl.
  Only process 0 writes."""
  if jax.process_index() > 0:
    return
  if changes:
    logging.warning("Config changes on restart of %s:\n%s", workdir,
                    _describe(changes))
    workdir.add_change({"time": time.time(), "changes": {
        key: {"old": old, "new": new} for key, (old, new) in
        changes.items()}})
  workdir.write_config(keys)


def devices_change(saved_mesh, mesh):
  """{"devices": (old, new)} when a checkpoint saved on `saved_mesh` (its
  shape; None for checkpoints older than the record) resumes on `mesh`,
  else {}: a change that the config does not show where a mesh size of -1
  takes whatever devices there are."""
  now = dict(mesh.shape)
  if saved_mesh is None or saved_mesh == now:
    return {}
  return {"devices": (_describe_devices(saved_mesh), _describe_devices(now))}


def _describe_devices(shape):
  """{"data": 8, ...} -> "8 (data=8 x fsdp=1 x model=1)"."""
  return f"{math.prod(shape.values())} ({sharding.describe_mesh(shape)})"


def differences(old, new):
  """{dotted key: (old value, new value)} for every leaf of the Settings
  `old` and `new` that differs; a resolved key that `old` holds at its
  default (unrecorded) is what `new` resolved it to."""
  old, new = (_flatten(settings.as_json(keys)) for keys in (old, new))
  old.update({key: new[key] for key, default in RESOLVED_KEYS.items()
              if old.get(key) == default})
  return {key: (old.get(key, "<absent>"), new.get(key, "<absent>"))
          for key in sorted(old.keys() | new.keys())
          if old.get(key, "<absent>") != new.get(key, "<absent>")}


def refusal(workdir, refused):
  return (
      f"{workdir} holds a run with another config; refusing to change it "
      f"(config.json and the checkpoints are left as they were):\n"
      f"{_describe(refused)}\n"
      f"Only {', '.join(CHANGEABLE_KEYS)} may change when a run is "
      "restarted; use a new --workdir for a new experiment.")


def _describe(changes):
  return "\n".join(f"  {key}: {old!r} -> {new!r}"
                   for key, (old, new) in changes.items())


def _flatten(tree, prefix=""):
  if not isinstance(tree, dict):
    return {prefix[:-1]: tree}
  flat = {}
  for key, value in tree.items():
    flat.update(_flatten(value, f"{prefix}{key}."))
  return flat
