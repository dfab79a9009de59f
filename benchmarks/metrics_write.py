r"""What one metrics row costs a run: metrics.jsonl is rewritten whole at
each row (Cloud Storage cannot append; runs/writers.py), and the row's
TensorBoard summary is written.

  python benchmarks/metrics_write.py [--rows=100,1000,10000] [--repeats=5]

For each count of rows already in the file, the median seconds of one more
row (`JsonlWriter.write_scalars`: the whole file replaced), in a local
workdir and, run as root, in a bucket of the tests' local Cloud Storage
(tests/gcs.py). The emulator is on this machine: a real bucket adds its
round trip (tens of ms) and its upload rate to the second figure.

Then the median ms of one row of TensorBoard events, in a local folder:
`TensorBoardWriter.write_scalars` (the row's scalars in one summary) next
to one `tf.summary.scalar` call a scalar, which it replaced.
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# While this process is one thread: a namespace where Cloud Storage's hosts
# are the emulator's.
from tests import gcs  # pylint: disable=g-import-not-at-top,wrong-import-position

gcs.enter_namespace()

from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position

flags.DEFINE_list("rows", ["100", "1000", "10000"], "Rows already written.")
flags.DEFINE_integer("repeats", 5, "Rows timed per count; the median shown.")

# A row as the digits run logs it: its training metrics and time buckets.
ROW = {"train_loss": 2.302585, "learning_rate": 0.001, "grad_norm": 1.05,
       "img_per_sec_per_device": 1234.5, "flops_per_step": 1.2e12,
       "tflops_per_sec_per_device": 12.3, "mfu": 0.41,
       "train_skipped_examples": 0.0, "core_days": 0.0123, "goodput": 0.87,
       **{f"time/{b}": 12.5 for b in ("startup", "compile", "train", "input",
                                      "checkpoint", "eval", "lost", "other")}}


def median_row_seconds(location, rows, repeats):
  import json  # pylint: disable=g-import-not-at-top

  from vit_jax.runs import workdir, writers  # pylint: disable=g-import-not-at-top
  place = workdir.Workdir(location)
  place.write_metrics_lines(
      [json.dumps({"step": s, **ROW}) + "\n" for s in range(1, rows + 1)])
  writer = writers.JsonlWriter(place, resume_step=rows)
  times = []
  for step in range(rows + 1, rows + 1 + repeats):
    start = time.perf_counter()
    writer.write_scalars(step, ROW)
    times.append(time.perf_counter() - start)
  size = len("".join(place.metrics_lines()))
  return statistics.median(times), size


def median_event_row_ms(logdir, repeats):
  """(our writer's, one tf.summary.scalar a scalar's) median ms a row."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from vit_jax.runs import writers  # pylint: disable=g-import-not-at-top
  ours = writers.TensorBoardWriter(f"{logdir}/ours")
  per_scalar = tf.summary.create_file_writer(f"{logdir}/per_scalar")

  def each_scalar(step, row):
    with per_scalar.as_default():
      for name, value in row.items():
        tf.summary.scalar(name, value, step=step)

  medians = []
  for write in (ours.write_scalars, each_scalar):
    write(0, ROW)  # The first row traces TensorFlow's functions.
    times = []
    for step in range(1, 1 + repeats):
      start = time.perf_counter()
      write(step, ROW)
      times.append(time.perf_counter() - start)
    medians.append(1000 * statistics.median(times))
  return medians


def main(argv):
  del argv
  ours, per_scalar = median_event_row_ms(
      tempfile.mkdtemp(prefix="metrics_events_"), 20 * flags.FLAGS.repeats)
  print(f"events, a row of {len(ROW)} scalars: {ours:.2f} ms in one summary, "
        f"{per_scalar:.2f} ms a tf.summary.scalar each")
  places = {"local": tempfile.mkdtemp(prefix="metrics_write_")}
  try:
    os.environ.update(gcs.start())
    places["bucket"] = gcs.create_bucket() + "/run"
  except gcs.Unavailable as e:
    print(f"no local Cloud Storage: {e}")
  for name, location in places.items():
    for rows in map(int, flags.FLAGS.rows):
      seconds, size = median_row_seconds(f"{location}-{rows}", rows,
                                         flags.FLAGS.repeats)
      print(f"{name:6s} {rows:6d} rows ({size / 1e6:5.2f} MB): "
            f"{1000 * seconds:7.1f} ms a row")


if __name__ == "__main__":
  app.run(main)
