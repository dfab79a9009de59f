"""python -m vit_jax.main --config=configs/digits.py --workdir=DIR [--config.KEY=VALUE ...]"""

import logging as std_logging
import os

from absl import app, flags, logging
from ml_collections import config_flags

from vit_jax import train

config_flags.DEFINE_config_file("config", None, "An ml-collections config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, logs and metrics go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # TensorFlow only feeds data; it must not take accelerator memory from JAX.
  import tensorflow as tf
  tf.config.set_visible_devices([], "GPU")
  tf.config.set_visible_devices([], "TPU")

  # Orbax narrates every save at INFO; keep the log to our progress lines.
  logging.get_absl_logger().addFilter(
      lambda record: record.levelno >= std_logging.WARNING
      or "/orbax/" not in record.pathname)

  workdir = flags.FLAGS.workdir
  result = train.train_and_evaluate(flags.FLAGS.config, workdir)
  logging.info("final metrics: %s", result)
  print(f"test_accuracy {result['test_accuracy']:.4f} | core_days "
        f"{result['core_days']:.6f} | TensorBoard: tensorboard --logdir "
        f"{os.path.abspath(workdir)}")


if __name__ == "__main__":
  app.run(main)
