"""Time to the first batch of a resumed digits training stream.

  python benchmarks/resume.py [--steps=100,100000] [--json]

A resumed run builds its data stream at `start_step`. The stream jumps to
the epoch of that step and skips records only within it, so the wait for
the first batch should not grow with the step. This times it for the
`make train` run (configs/digits.py: batch 128 in the 16 input shares it
chooses, vit_jax/data/shares.py) at each step given, as the median of
--repeats.
"""

import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_list("steps", ["100", "100000"], "Steps to resume at.")
flags.DEFINE_integer("repeats", 5, "Timings per step; the median is shown.")
flags.DEFINE_string("data_dir", None, "TFDS data_dir (default: a temporary "
                    "directory where digits is prepared first).")
flags.DEFINE_bool("json", False, "One JSON object per step instead of a table.")


def seconds_to_first_batch(config, data_dir, step, num_shares):
  from vit_jax.data import sources
  from vit_jax.data import pipeline
  start = time.perf_counter()
  batches = pipeline.train_dataset(sources.lookup(config.dataset, data_dir),
                                   config.train_split,
                                   batch_size=config.batch_size,
                                   image_size=config.image_size,
                                   augment=config.augment,
                                   seed=config.seed,
                                   start_step=step,
                                   shares=tuple(range(num_shares)),
                                   num_shares=num_shares)
  next(iter(batches))
  return time.perf_counter() - start


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # TFDS narrates each share it opens.
  from configs import digits  # pylint: disable=g-import-not-at-top
  from vit_jax.data import shares as shares_lib, sources
  config = digits.get_config()
  data_dir = flags.FLAGS.data_dir or tempfile.mkdtemp()
  sources.get_builder(config.dataset, data_dir)  # Prepare once.
  epoch = sources.lookup(config.dataset,
                         data_dir).num_examples(config.train_split)
  num_shares = shares_lib.default(config.batch_size, epoch, 1)
  rows = []
  for step in map(int, flags.FLAGS.steps):
    times = [seconds_to_first_batch(config, data_dir, step, num_shares)
             for _ in range(flags.FLAGS.repeats)]
    rows.append({"start_step": step,
                 "epochs_before": step * config.batch_size / epoch,
                 "seconds_to_first_batch": statistics.median(times)})
  if flags.FLAGS.json:
    for row in rows:
      print(json.dumps(row))
    return
  print(f"{'start_step':>10} {'epochs before':>14} {'first batch (s)':>16}")
  for row in rows:
    print(f"{row['start_step']:>10} {row['epochs_before']:>14.0f} "
          f"{row['seconds_to_first_batch']:>16.3f}")


if __name__ == "__main__":
  app.run(main)
