"""Does the from-scratch recipe regularise? Test accuracy on digits with and
without each of its pieces, median over seeds.

  python benchmarks/regularisation.py [--seeds=3] [--train_split=train[:300]]

A ViT trained from scratch on a few hundred 8x8 digits fits them long
before the end, so what it scores on the 360 test digits depends on how it
is regularised. Each row trains configs/digits.py on --train_split, with
the digits config's own regularisation (dropout 0.2, weight decay 1.0)
turned down to --dropout and --weight_decay, and adds the row's pieces:
label smoothing (the paper's ImageNet recipe), RandAugment and Mixup (the
plain ViT baseline's), and all three. Every run sees the same batches for
a seed; rows differ only in their pieces. Prints one line per row: the
median, the seeds' accuracies, and the final train loss.
"""

import os
import sys
import tempfile

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import seeded_rows  # pylint: disable=wrong-import-position

flags.DEFINE_integer("seeds", 3, "Seeds per row.")
flags.DEFINE_string("train_split", "train[:300]", "What the model fits.")
flags.DEFINE_integer("steps", 600, "Training steps per run.")
flags.DEFINE_float("dropout", 0.0, "Dropout in every row.")
flags.DEFINE_float("weight_decay", 0.05, "Weight decay in every row.")
flags.DEFINE_string("randaugment", "2,5", "RandAugment of its rows: on 8x8 "
                    "digits magnitude 10 translates by 3.6 of 8 pixels.")
flags.DEFINE_string("rows", "none,smoothing,randaugment,mixup,all",
                    "Which rows to run.")
flags.DEFINE_string("data_dir", None, "Where digits is prepared (default: a "
                    "temporary directory).")
FLAGS = flags.FLAGS


def rows():
  smoothing = {"label_smoothing": 0.1}
  randaugment = {"randaugment": FLAGS.randaugment}
  mixup = {"mixup.prob": 1.0, "mixup.alpha": 0.2}
  table = {"none": {}, "smoothing": smoothing, "randaugment": randaugment,
           "mixup": mixup, "all": {**smoothing, **randaugment, **mixup}}
  return {name: table[name] for name in FLAGS.rows.split(",")}


def accuracy(overrides, seed, data_dir):
  return seeded_rows.digits_score({
      "data_dir": data_dir, "seed": seed, "train_split": FLAGS.train_split,
      "model.dropout_rate": FLAGS.dropout,
      "optimizer.weight_decay": FLAGS.weight_decay, **overrides}, FLAGS.steps)


def main(argv):
  del argv
  logging.set_verbosity(logging.ERROR)
  data_dir = FLAGS.data_dir or tempfile.mkdtemp()
  print(f"digits {FLAGS.train_split}, {FLAGS.steps} steps, dropout "
        f"{FLAGS.dropout}, weight decay {FLAGS.weight_decay}; test accuracy "
        f"over seeds 0..{FLAGS.seeds - 1}")
  table = rows()
  seeded_rows.report(table, lambda name, seed: accuracy(table[name], seed,
                                                        data_dir), FLAGS.seeds)


if __name__ == "__main__":
  from vit_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.prepare()  # As vit_jax.main: one device per core, quiet.
  runtime.prepare_to_train()
  app.run(main)
