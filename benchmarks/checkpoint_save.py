r"""How long a checkpoint save takes, with and without the arrays' fingerprints.

  python benchmarks/checkpoint_save.py [--models=digits,B/16] [--repeats=3]

For each model, a fresh train state (Adam moments included) on this host's
devices is saved through runs/checkpoints.py (`save` then `finish`: the
fingerprints are computed on the devices and the arrays written), and the
same state through orbax alone, as `save` did before fingerprints. Prints
the median seconds of each, and the fingerprints' own time.
"""

import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_list("models", ["digits", "B/16"], "'digits' (configs/digits.py) "
                  "or a ViT name, trained on 224 px with 1000 classes.")
flags.DEFINE_integer("repeats", 3, "Saves of each kind; the median is shown.")


def state_of(name):
  import jax  # pylint: disable=g-import-not-at-top

  from configs import digits  # pylint: disable=g-import-not-at-top
  from vit_jax import (
    models,  # pylint: disable=g-import-not-at-top
    sharding,  # pylint: disable=g-import-not-at-top
  )
  from vit_jax.runs import settings  # pylint: disable=g-import-not-at-top
  from vit_jax.training import step  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  classes = 10
  if name != "digits":  # The variant's sizes over the digits model's.
    config.model.update(name=name, **models.VARIANTS[name.split("/")[0]])
    config.image_size, classes = 224, 1000
  keys = settings.of(config)
  program = step.build(keys, sharding.make_mesh(config.mesh),
                       step.parts(keys, classes))
  return program.init(jax.random.key(0))


def seconds(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def main(argv):
  del argv
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)  # Orbax narrates every save.
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  from vit_jax.runs import checkpoints, fingerprints  # pylint: disable=g-import-not-at-top
  print("| state | MB | save with fingerprints | orbax alone | "
        "fingerprints |\n|---|---|---|---|---|")
  for name in flags.FLAGS.models:
    state = state_of(name)
    megabytes = sum(x.nbytes for x in jax.tree.leaves(state)) / 1e6
    fingerprints.of(state)  # Compiled once, as a run's first save does.
    with tempfile.TemporaryDirectory() as root:
      steps = iter(range(1, 10**6))
      manager = checkpoints.manager(os.path.join(root, "with"), keep=1)

      def with_fingerprints():
        checkpoints.save(manager, next(steps), state, {"train_seconds": 0})
        checkpoints.finish(manager)

      plain = checkpoints.manager(os.path.join(root, "without"), keep=1)

      def orbax_alone():
        plain.save(next(steps), args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            progress=ocp.args.JsonSave({"train_seconds": 0})))
        plain.wait_until_finished()

      with_fingerprints(), orbax_alone()  # Orbax compiles on a first save.
      times = {"after": [], "before": [], "alone": []}
      for _ in range(flags.FLAGS.repeats):  # Interleaved: the same noise.
        times["after"].append(seconds(with_fingerprints))
        times["before"].append(seconds(orbax_alone))
        times["alone"].append(seconds(lambda: fingerprints.of(state)))
      after, before, alone = (statistics.median(times[key])
                              for key in ("after", "before", "alone"))
    print(f"| {name} | {megabytes:,.0f} | {after:.3f} s | {before:.3f} s | "
          f"{alone:.3f} s |", flush=True)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))
  from vit_jax import cli  # pylint: disable=g-import-not-at-top
  cli.prepare()
  app.run(main)
