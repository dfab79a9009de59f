"""Where metrics go: TensorBoard, the log, and `metrics.jsonl`.

`metrics.jsonl` holds one JSON object per write, `{"step": n, name: value}`,
at most one value per step and metric: a resumed run first drops the rows
that the interrupted run wrote after the step it resumes from.

Cloud Storage cannot append to an object, so the writer keeps the file's
rows and replaces the whole file at each row, locally and on GCS alike: a
reader (`read_rows`, a user's `tail`) sees every row as soon as it is
written, and a crash leaves the file as it was before the row. Each write
costs the whole file, a few hundred bytes a row (docs/runs.md, "Workdirs on
Cloud Storage").
"""

import json

import jax
from clu import metric_writers

from vit_jax.runs import storage
from vit_jax.runs.workdir import Workdir


class JsonlWriter(metric_writers.interface.MetricWriter):
  """Adds `{"step": n, name: value, ...}` rows to a workdir's metrics.jsonl,
  dropping first the rows after `resume_step` (None: keeps them all)."""

  def __init__(self, workdir, resume_step=None):
    self._workdir = workdir
    stored = workdir.metrics_lines()
    # A line cut short by a crash (of an older, appending run) goes too.
    self._lines = [line for line in stored
                   if _step(line) is not None and (
                       resume_step is None or _step(line) <= resume_step)]
    self._dirty = len(self._lines) < len(stored)
    self.flush()

  def write_scalars(self, step, scalars):
    row = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
    self._lines.append(json.dumps(row) + "\n")
    self._dirty = True
    self.flush()

  def write_summaries(self, step, values, metadata=None): pass
  def write_images(self, step, images): pass
  def write_videos(self, step, videos): pass
  def write_audios(self, step, audios, *, sample_rate): pass
  def write_texts(self, step, texts): pass
  def write_histograms(self, step, arrays, num_buckets=None): pass
  def write_hparams(self, hparams): pass

  def flush(self):
    """Replaces the file with the rows so far (when any are new); after a
    failed write, the next one writes them all."""
    if self._dirty:
      self._workdir.write_metrics_lines(self._lines)
      self._dirty = False

  def close(self):
    self.flush()


def create(workdir, resume_step):
  """The run's writer (`workdir`: a runs.workdir.Workdir); only process 0
  writes files, the others only log. A disk that cannot take the metrics
  stops the run in one message."""
  if jax.process_index() > 0:
    return metric_writers.create_default_writer(workdir.events,
                                                just_logging=True)
  with storage.stops_on_failure(f"write the metrics in {workdir}"):
    jsonl = JsonlWriter(workdir, resume_step)
  return StoppingOnStorageFailure(metric_writers.MultiWriter([
      metric_writers.create_default_writer(workdir.events), jsonl]), workdir)


class StoppingOnStorageFailure:
  """`writer`, whose storage failures (TensorBoard's asynchronous ones
  among them, which surface at a later write or flush) end the run with
  storage.stops_on_failure's message."""

  def __init__(self, writer, workdir):
    self._writer, self._workdir = writer, workdir

  def write_scalars(self, step, scalars):
    with storage.stops_on_failure(f"write the metrics in {self._workdir}"):
      self._writer.write_scalars(step, scalars)

  def flush(self):
    with storage.stops_on_failure(f"write the metrics in {self._workdir}"):
      self._writer.flush()


def read_rows(workdir):
  """The rows of the metrics file of the run in `workdir` (a Workdir, path
  or URL); a line cut short by a crash is skipped."""
  return [json.loads(line) for line in Workdir(workdir).metrics_lines()
          if _step(line) is not None]


def _step(line):
  try:
    return json.loads(line)["step"]
  except (ValueError, KeyError, TypeError):
    return None
