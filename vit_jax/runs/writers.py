"""Where metrics go: TensorBoard, the log, and `metrics.jsonl`.

`metrics.jsonl` holds one JSON object per write, `{"step": n, name: value}`,
at most one value per step and metric: a resumed run first drops the rows
that the interrupted run wrote after the step it resumes from.
"""

import json
import os

import jax
from clu import metric_writers

from vit_jax.runs import storage

METRICS_FILE = "metrics.jsonl"


class JsonlWriter(metric_writers.interface.MetricWriter):
  """Appends `{"step": n, name: value, ...}` lines to a file."""

  def __init__(self, path):
    self._file = open(path, "ab", buffering=0)  # pylint: disable=consider-using-with

  def write_scalars(self, step, scalars):
    row = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
    append_line(self._file, json.dumps(row))

  def write_summaries(self, step, values, metadata=None): pass
  def write_images(self, step, images): pass
  def write_videos(self, step, videos): pass
  def write_audios(self, step, audios, *, sample_rate): pass
  def write_texts(self, step, texts): pass
  def write_histograms(self, step, arrays, num_buckets=None): pass
  def write_hparams(self, hparams): pass
  def flush(self): pass  # Unbuffered: each row is written when it comes.
  def close(self): self._file.close()


def append_line(file, line):
  """Appends `line` to `file` (opened with open(path, "ab", buffering=0))
  whole or not at all: what a failing write (a full disk) left of it is cut
  off before the error goes on."""
  data = (line + "\n").encode()
  end = file.seek(0, os.SEEK_END)
  try:
    written = 0
    while written < len(data):  # A full disk may take part of it first.
      written += file.write(data[written:])
  except OSError:
    file.truncate(end)
    raise


def create(workdir, resume_step):
  """The run's writer; only process 0 writes files, the others only log.
  A disk that cannot take the metrics stops the run in one message."""
  if jax.process_index() > 0:
    return metric_writers.create_default_writer(workdir, just_logging=True)
  path = os.path.join(workdir, METRICS_FILE)
  drop_rows_after(path, resume_step)
  return StoppingOnStorageFailure(metric_writers.MultiWriter([
      metric_writers.create_default_writer(workdir),
      JsonlWriter(path)]), workdir)


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
  """The rows of the run's metrics file; a line cut short by a crash is
  skipped."""
  with open(os.path.join(workdir, METRICS_FILE)) as f:
    return [json.loads(line) for line in f if _step(line) is not None]


def drop_rows_after(path, step):
  """Removes the rows past `step`: the steps a resumed run will write again."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.readlines()
  # A line cut short by a crash mid-write is dropped too.
  kept = [line for line in lines if _step(line) is not None
          and _step(line) <= step]
  if len(kept) < len(lines):
    with open(path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(path + ".tmp", path)


def _step(line):
  try:
    return json.loads(line)["step"]
  except (ValueError, KeyError, TypeError):
    return None
