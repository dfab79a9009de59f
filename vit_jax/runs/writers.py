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

The event files are TensorFlow's summaries, written as each row comes: a
storage failure surfaces at that row or at the next flush. (CLU's writers
are not used: importing them imports TensorBoard's hparams plugin, whose
use of tf.keras would load Keras into every tool, runtime.LEAN_TENSORFLOW.)
"""

import json

import jax
import numpy as np
from absl import logging
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.util import tensor_util

from vit_jax.runs import failures
from vit_jax.runs.workdir import Workdir

# What marks a summary value as a scalar for TensorBoard's scalar dashboard.
_SCALAR = scalar_metadata.create_summary_metadata(display_name=None,
                                                  description=None)


class JsonlWriter:
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

  def flush(self):
    """Replaces the file with the rows so far (when any are new); after a
    failed write, the next one writes them all."""
    if self._dirty:
      self._workdir.write_metrics_lines(self._lines)
      self._dirty = False


class TensorBoardWriter:
  """Scalars into TensorBoard event files in `logdir` (a path or URL), each
  as `tf.summary.scalar` writes it, a row's in one summary: one eager write
  a row, where `tf.summary.scalar` runs several ops a scalar
  (docs/runs.md)."""

  def __init__(self, logdir):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._tf = tf
    self._writer = tf.summary.create_file_writer(logdir)

  def write_scalars(self, step, scalars):
    summary = summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(
            tag=name, metadata=_SCALAR,
            tensor=tensor_util.make_tensor_proto(np.float32(value)))
        for name, value in scalars.items()])
    with self._writer.as_default():
      self._tf.summary.experimental.write_raw_pb(
          summary.SerializeToString(), step=step)

  def flush(self):
    self._writer.flush()


class LoggingWriter:
  """Each row as one line of the log."""

  def write_scalars(self, step, scalars):
    logging.info("[%d] %s", step, ", ".join(
        f"{name}={value}" for name, value in scalars.items()))

  def flush(self):
    pass


def create(workdir, resume_step):
  """The run's writer (`workdir`: a runs.workdir.Workdir); only process 0
  writes files, the others only log. A disk that cannot take the metrics
  stops the run in one message."""
  if jax.process_index() > 0:
    return LoggingWriter()
  with failures.stops_on_failure(f"write the metrics in {workdir}"):
    jsonl = JsonlWriter(workdir, resume_step)
    events = TensorBoardWriter(workdir.events)
  return FileWriters([LoggingWriter(), events, jsonl], workdir)


class FileWriters:
  """Each row and flush to every one of `writers`; their storage failures
  (TensorBoard's among them, which its file writer may raise at a later
  write or flush) end the run with failures.stops_on_failure's message."""

  def __init__(self, writers, workdir):
    self._writers, self._workdir = writers, workdir

  def write_scalars(self, step, scalars):
    with failures.stops_on_failure(f"write the metrics in {self._workdir}"):
      for writer in self._writers:
        writer.write_scalars(step, scalars)

  def flush(self):
    with failures.stops_on_failure(f"write the metrics in {self._workdir}"):
      for writer in self._writers:
        writer.flush()


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
