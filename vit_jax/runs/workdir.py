"""A run's workdir, local or on Cloud Storage: its layout and every file in it.

  WORKDIR/config.json            the run's config (runs/store.py judges changes)
  WORKDIR/config_changes.jsonl   one row per restart that changed the config
  WORKDIR/metrics.jsonl          one row per step that logged (runs/writers.py)
  WORKDIR/time.json              the goodput buckets as last written
  WORKDIR/lock.json              the run that writes it now (runs/lock.py)
  WORKDIR/checkpoints/           orbax, one folder per step (runs/checkpoints.py)
  WORKDIR/events.out.tfevents.*  TensorBoard
  WORKDIR/plugins/profile/RUN/   jax.profiler traces (training/profiling.py)
  WORKDIR/figures/               vit_jax.figures' default output
  WORKDIR/exports/               where exports inside a workdir may go

Only this module joins a workdir's path with a file name. Every file goes
through the path layer (vit_jax/paths.py, etils.epath), so a workdir on
`gs://` works as a local one: the location is kept as the user gave it. A
file that replaces another is replaced whole. Cloud Storage cannot append,
so the files that grow (metrics.jsonl, config_changes.jsonl) are rewritten
whole (docs/runs.md, "Workdirs on Cloud Storage").
"""

import json
import os

from vit_jax import errors, paths
from vit_jax.runs import checkpoints, lock, settings

CONFIG_FILE = "config.json"
CHANGES_FILE = "config_changes.jsonl"
METRICS_FILE = "metrics.jsonl"
TIME_FILE = "time.json"
CHECKPOINTS = "checkpoints"
PROFILES = "plugins/profile"  # Where TensorBoard's profile plugin looks.
FIGURES = "figures"
EXPORTS = "exports"


class Workdir:
  """The workdir at `location` (a local path or a gs:// URL)."""

  def __init__(self, location):
    if isinstance(location, Workdir):
      location = location.location
    self.location = os.fspath(location)
    self.path = paths.path(self.location)

  def __str__(self):
    """As a user can paste it: a local path absolute, a URL as given."""
    return paths.shown(self.location)

  def __repr__(self):
    return f"Workdir({self.location!r})"

  def _file(self, name):
    return self.path / name

  # The run's config.

  def has_run(self):
    return self._file(CONFIG_FILE).exists()

  def read_config(self):
    """The run's Settings as recorded (settings.from_record); an
    InputError when there is none, or when it does not read."""
    path = self._file(CONFIG_FILE)
    if not path.exists():
      what = ("is a file, not a workdir" if self.path.exists() and
              not self.path.is_dir() else f"has no {CONFIG_FILE}")
      raise errors.InputError(f"{self} holds no run: it {what}")
    try:
      recorded = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
      raise errors.InputError(
          f"{paths.shown(path)} is damaged ({type(e).__name__}: "
          f"{str(e)[:120]}): restore it from a copy, or start the run in a "
          "new workdir") from e
    return settings.from_record(recorded, paths.shown(path))

  def write_config(self, keys):
    """Replaces config.json with the Settings `keys`."""
    self.path.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(self._file(CONFIG_FILE),
                           json.dumps(settings.as_json(keys), indent=2))

  def add_change(self, row):
    """Adds `row` (a dict) to config_changes.jsonl."""
    self._rewrite_lines(CHANGES_FILE, [*self._lines(CHANGES_FILE),
                                       json.dumps(row) + "\n"])

  # metrics.jsonl: rows of {"step": n, name: value}.

  def metrics_lines(self):
    """The lines of metrics.jsonl as stored ([] when there is none)."""
    return self._lines(METRICS_FILE)

  def write_metrics_lines(self, lines):
    """Replaces metrics.jsonl with `lines` (each ending in a newline)."""
    self._rewrite_lines(METRICS_FILE, lines)

  # time.json: the goodput buckets (training/reporting/goodput.py reads
  # them).

  def read_time(self):
    """time.json's contents, or None when there is none."""
    try:
      return json.loads(self._file(TIME_FILE).read_text())
    except FileNotFoundError:
      return None

  def write_time(self, record):
    paths.write_atomically(self._file(TIME_FILE), json.dumps(record))

  # What others write in it.

  def lock(self, wait=True):
    """`with workdir.lock():` this process writes the workdir; `wait`: for
    another host's lock to lapse (runs/lock.py)."""
    return lock.WorkdirLock(self.path, wait)

  @property
  def checkpoints(self):
    """The folder of the orbax checkpoints, as a str."""
    return os.fspath(self._file(CHECKPOINTS))

  def checkpoint_manager(self, keep, preserve=()):
    """The training run's orbax manager, keeping the newest `keep` steps
    and those of `preserve`."""
    return checkpoints.manager(self.checkpoints, keep, preserve=preserve)

  def checkpoint_reader(self):
    """An orbax manager that writes nothing, to read the checkpoints."""
    return checkpoints.manager(self.checkpoints, keep=None, read_only=True)

  def params_reader(self):
    """An orbax manager that writes nothing, to read a step's params alone
    (checkpoints.restore_params)."""
    return checkpoints.params_reader(self.checkpoints)

  def checkpoint_steps(self):
    return checkpoints.complete_steps(self.checkpoints)

  @property
  def events(self):
    """Where TensorBoard's event files go."""
    return self.location

  def add_profile(self, local):
    """Copies the trace that jax.profiler wrote under the local folder
    `local` (plugins/profile/RUN/FILES) into this workdir, each file whole;
    returns where its run's folder is."""
    traced = paths.path(local) / PROFILES
    where = None
    for run in traced.iterdir():
      where = self._file(PROFILES) / run.name
      where.mkdir(parents=True, exist_ok=True)
      for trace in run.iterdir():
        paths.write_atomically(where / trace.name, trace.read_bytes())
    return where

  def tensorboard_command(self):
    # TensorBoard's fast loader reads local folders only.
    fast = " --load_fast=false" if paths.is_url(self.location) else ""
    return f"tensorboard --logdir {self}{fast}"

  @property
  def figures(self):
    return os.fspath(self._file(FIGURES))

  @property
  def exports(self):
    return os.fspath(self._file(EXPORTS))

  def may_hold(self, output):
    """Whether a tool may write `output` (a path) inside this workdir: only
    under its exports/ or figures/ folder."""
    output = paths.path(output)
    return any(output == place or place in output.parents
               for place in (paths.path(self.exports),
                             paths.path(self.figures)))

  # Branching: another workdir that starts where this one was.

  def branch(self, step, to):
    """Makes `to` (a Workdir holding no run) this run as it stood at
    `step`, one of its complete checkpoints: that checkpoint, the config
    as recorded and its changes, and the metrics up to the step. A run
    started in `to` resumes from `step` (a WSD decay of another length,
    training/optimizer.py). The TensorBoard events, profiles and figures
    stay here; `to`'s new ones begin at the step."""
    to.path.mkdir(parents=True, exist_ok=True)
    # The checkpoint first, config.json last: a copy cut short is no run.
    source = self._file(CHECKPOINTS) / str(step)
    for file in _files_under(source):
      paths.write_atomically(to._file(CHECKPOINTS) / file.relative_to(
          source.parent), file.read_bytes())
    kept = [line for line in self.metrics_lines()
            if json.loads(line).get("step", 0) <= step]
    to.write_metrics_lines(kept)
    to._rewrite_lines(CHANGES_FILE, self._lines(CHANGES_FILE))
    paths.write_atomically(to._file(CONFIG_FILE),
                           self._file(CONFIG_FILE).read_bytes())

  # Files that grow, on a store that cannot append.

  def _lines(self, name):
    try:
      return self._file(name).read_bytes().decode(
          "utf-8", errors="replace").splitlines(keepends=True)
    except FileNotFoundError:
      return []

  def _rewrite_lines(self, name, lines):
    self.path.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(self._file(name), "".join(lines))


def _files_under(folder):
  """Every file under `folder`, at any depth (a bucket's glob stops at
  one level)."""
  for entry in folder.iterdir():
    if entry.is_dir():
      yield from _files_under(entry)
    else:
      yield entry


def check_output(output, flag):
  """Refuses `output`, a file or folder a tool (export, figures) is about to
  write as `flag`, when it lies inside a run's workdir other than under
  that workdir's exports/ or figures/: a run's files are the run's (an HF
  export's config.json would replace the run's)."""
  path = paths.path(output)
  for folder in [path, *path.parents]:
    workdir = Workdir(folder)
    if workdir.has_run() and not _is_weights_export(folder):
      if workdir.may_hold(path):
        return
      raise errors.InputError(
          f"{flag}={output} is inside the workdir of a run ({workdir}), "
          f"whose files are the run's: write under {workdir.exports} (or "
          f"{workdir.figures}), or outside the workdir")


def _is_weights_export(folder):
  """Whether `folder` is an HF export (its config.json beside the model's
  weights, which no run's workdir holds at its top): one written again is
  replaced, not taken for a run."""
  return any((folder / name).exists()
             for name in ("model.safetensors", "model.safetensors.index.json"))
