"""AdamW against Muon, cosine against warmup-stable-decay, on the digits:
test accuracy and final train loss after the same steps, over seeds.

  python benchmarks/optimizers.py [--seeds=3] [--steps=300]

Each row trains configs/digits.py (batch 128, its warm-up of 100 steps,
weight decay 1.0, dropout 0.2, gradients clipped at 1) for --steps steps
with one optimizer and one decay; Muon (training/muon.py) at the same peak
rate as AdamW (its updates scaled to AdamW's RMS, timm's and Kimi's
default) on the blocks' matrices, AdamW on the rest. A seed gives every
row the same init and batches. Prints one line per row: the median test
accuracy, each seed's, and each seed's last train loss.
"""

import os
import sys
import tempfile

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import seeded_rows  # pylint: disable=wrong-import-position

flags.DEFINE_integer("seeds", 3, "Seeds per row.")
flags.DEFINE_integer("steps", 300, "Training steps per run.")
flags.DEFINE_float("learning_rate", 3e-3, "The peak rate of every row.")
flags.DEFINE_string("rows", "adamw-cosine,adamw-wsd,muon-cosine,muon-wsd",
                    "Which rows to run: OPTIMIZER-DECAY.")
flags.DEFINE_string("data_dir", None, "Where digits is prepared (default: a "
                    "temporary directory).")
FLAGS = flags.FLAGS
OPTIMIZERS = {"adamw": "adam", "muon": "muon"}


def run(row, seed, data_dir):
  """(test accuracy, last train loss) of one row's run."""
  name, decay = row.split("-")
  return seeded_rows.digits_score({
      "data_dir": data_dir, "seed": seed, "optimizer.name": OPTIMIZERS[name],
      "optimizer.decay": decay,
      "optimizer.learning_rate": FLAGS.learning_rate}, FLAGS.steps)


def main(argv):
  del argv
  logging.set_verbosity(logging.ERROR)
  data_dir = FLAGS.data_dir or tempfile.mkdtemp()
  print(f"digits, {FLAGS.steps} steps at peak rate {FLAGS.learning_rate}; "
        f"test accuracy over seeds 0..{FLAGS.seeds - 1}")
  seeded_rows.report(FLAGS.rows.split(","),
                     lambda row, seed: run(row, seed, data_dir), FLAGS.seeds)


if __name__ == "__main__":
  from vit_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.prepare()  # As vit_jax.main: one device per core, quiet.
  runtime.prepare_to_train()
  app.run(main)
