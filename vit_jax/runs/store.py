"""A workdir guards its run: a restart must use the config it was started with.

`config.json` in the workdir (read and written by runs/workdir.py) is the
config of the run. A restart with a config that differs in
anything but CHANGEABLE_KEYS is refused (`differences_allowed`, called by
vit_jax/training/resolve.py) before anything in the workdir is written;
allowed changes are appended to `config_changes.jsonl` and `config.json`
is updated (`record`).
"""

import fnmatch
import json
import math
import time

import jax
from absl import logging

from vit_jax import errors, sharding
from vit_jax.runs import settings

# What may change between restarts of one run, as runs/settings.py marks
# it (and says why): fnmatch patterns of dotted keys.
CHANGEABLE_KEYS = settings.changeable_keys()
# Keys added since runs were first recorded, with the value that does what
# a run recorded without them did, or settings.RESOLVED: whatever the
# restart resolves the key to. input_shares: such a run read one share per
# data-parallel device, which vit_jax/training/resolve.py resolves.
ADDED_KEYS = settings.added_keys()


def differences_allowed(config, recorded, workdir):
  """Refuses `config` unless it is `recorded`, the config of the run in
  `workdir` (None: there is none yet), but for CHANGEABLE_KEYS; returns
  those changes."""
  if recorded is None:
    return {}
  changes = differences(_as_json(recorded), _as_json(config))
  refused = {k: v for k, v in changes.items() if not changeable(k)}
  if refused:
    raise errors.ConfigError(refusal(workdir, refused))
  return changes


def changeable(key):
  return any(fnmatch.fnmatchcase(key, pattern) for pattern in CHANGEABLE_KEYS)


def record(config, workdir, changes):
  """Writes `config` as the run's config.json in `workdir` (a Workdir),
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
  workdir.write_config(_as_json(config))


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


def _as_json(config):
  return json.loads(config.to_json_best_effort())


def differences(old, new):
  """{dotted key: (old value, new value)} for every leaf that differs."""
  old, new = _flatten(old), _flatten(new)
  old.update({key: new[key] if value is settings.RESOLVED else value
              for key, value in ADDED_KEYS.items()
              if key in new and key not in old})
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
