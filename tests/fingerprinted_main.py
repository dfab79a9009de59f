"""`python -m vit_jax.main`, also writing a fingerprint of each row of each
training batch this process reads to $BATCH_LOG.<process index>
(tests/util.py, logging_batches): what tests compare to prove that two runs
read the same batches."""

import os
import sys

from vit_jax import cli

if __name__ == "__main__":
  cli.prepare()
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))
  from tests import util  # pylint: disable=g-import-not-at-top
  from vit_jax import main
  from vit_jax.training import loop
  loop.train_batches = util.logging_batches(os.environ["BATCH_LOG"],
                                             loop.train_batches)
  cli.run(main.main)
