"""What the goodput accounting costs the training loop, per step.

  python benchmarks/goodput_overhead.py [--steps=100000]

The loop (training/loop.py) switches buckets around each step's input and
around the evaluators and saves (training/reporting/goodput.py): three
`counting` blocks a step, each two reads of the clock, with JAX's compile
listener registered. This times those three blocks alone, per step, to set
beside a step's time; nothing in them waits for a device.
"""

import time

from absl import app, flags

from vit_jax.training.reporting import goodput

flags.DEFINE_integer("steps", 100_000, "Steps' worth of bucket switches.")


def main(argv):
  del argv
  steps = flags.FLAGS.steps
  accounts = goodput.Accounts()
  try:
    accounts.switch("train")
    start = time.perf_counter()
    for _ in range(steps):
      with accounts.counting("input"):
        pass
      with accounts.counting("eval"):
        pass
      with accounts.counting("checkpoint"):
        pass
    per_step = (time.perf_counter() - start) / steps
  finally:
    accounts.close()
  print(f"{per_step * 1e6:.2f} us of accounting per step ({steps:,} steps)")


if __name__ == "__main__":
  app.run(main)
