"""Time to the first batch of a resumed training stream, for both readers.

  python benchmarks/resume.py [--num_images=4096] [--at=0.1,0.9] [--json]

A resumed run builds its data stream at `start_step`. Read at random
(ArrayRecord, vit_jax/data/random_access.py), the stream starts at the
step's batch; streamed (TFRecord, vit_jax/data/pipeline.py), it jumps to
the step's epoch and reads, without decoding, the records of that epoch
before the step. This times the first batch of each, resumed at fractions
--at of the second epoch, on --num_images ImageNet-shaped JPEGs (made as
benchmarks/input_pipeline.py makes them) prepared as a folder dataset in
both formats: the stream of one v3-8 host, a per-host batch of 256 in 8
shares, "inception_crop,flip" at 224 px. Each figure is the median of
--repeats; the page cache holds the files (a warm host).
"""

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import input_pipeline  # pylint: disable=wrong-import-position

flags.DEFINE_list("at", ["0.1", "0.9"], "Where in an epoch to resume.")
flags.DEFINE_integer("repeats", 5, "Timings per figure; the median is shown.")
FLAGS = flags.FLAGS


def seconds_to_first_batch(source, step):
  from vit_jax.data import pipeline, preprocess
  start = time.perf_counter()
  batches = pipeline.train_dataset(
      source, "train", batch_size=FLAGS.batch_size,
      image_size=FLAGS.image_size,
      augmentation=preprocess.augmentation(FLAGS.augment), start_step=step,
      shares=tuple(range(FLAGS.num_shares)), num_shares=FLAGS.num_shares)
  next(iter(batches))
  return time.perf_counter() - start


def measure(data_dir):
  readers = input_pipeline.both_formats(data_dir)
  epoch = readers["streamed"].num_examples("train")
  steps_per_epoch = epoch / FLAGS.batch_size
  rows = []
  for fraction in map(float, FLAGS.at):
    step = int(steps_per_epoch * (1 + fraction))
    for name, source in readers.items():
      times = [seconds_to_first_batch(source, step)
               for _ in range(FLAGS.repeats)]
      rows.append({"reader": name, "epoch_fraction": fraction,
                   "start_step": step, "epoch_examples": epoch,
                   "seconds_to_first_batch": statistics.median(times)})
  return rows


def main(argv):
  del argv
  logging.set_verbosity(logging.ERROR)  # No hint to convert, no narration.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds.disable_progress_bar()
  with contextlib.ExitStack() as stack:
    data_dir = FLAGS.data_dir or stack.enter_context(
        tempfile.TemporaryDirectory())
    rows = measure(data_dir)
  if FLAGS.json:
    for row in rows:
      print(json.dumps(row))
    return
  print(f"{'reader':>9} {'epoch at':>9} {'start_step':>10} "
        f"{'first batch (s)':>16}")
  for row in rows:
    print(f"{row['reader']:>9} {row['epoch_fraction']:>9.0%} "
          f"{row['start_step']:>10} {row['seconds_to_first_batch']:>16.3f}")


if __name__ == "__main__":
  FLAGS.set_default("num_images", 4096)
  app.run(main)
