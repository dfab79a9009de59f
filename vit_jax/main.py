"""python -m vit_jax.main --config=configs/digits.py --workdir=DIR [--config.KEY=VALUE ...]

On a pod every host runs this same command. `jax.distributed` is initialised
on its own on Cloud TPU VMs; elsewhere (several processes on one machine, as
launch/local_pod.sh starts them) --coordinator_address, --num_processes and
--process_id say who is who.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags, logging

from vit_jax import cli
from vit_jax.cli import shared_flags
from vit_jax.training import loop, resolve
from vit_jax.training.reporting import goodput, progress as progress_lib

shared_flags.define_training()


def main(argv):
  del argv  # cli.run refuses positional arguments.
  shared_flags.prepare_to_train()
  resolved = resolve.run(flags.FLAGS.config, flags.FLAGS.workdir)
  workdir = resolved.workdir
  result = loop.train_and_evaluate(resolved, started=goodput.process_start())
  logging.info("final metrics: %s", result)
  if jax.process_index() > 0:
    return
  if "stopped_at_step" in result:
    print(f"stopped at step {result['stopped_at_step']}: checkpoint saved in "
          f"{workdir}; run the same command to resume")
    return
  # What the evaluators measured last: their names prefix their metrics.
  prefixes = tuple(f"{evaluation.name}{sep}" for evaluation in
                   resolved.evaluations for sep in "_/")
  scores = progress_lib.scores({key: value for key, value in
                                sorted(result.items())
                                if key.startswith(prefixes)})
  print(" | ".join([*scores, f"core_days {result['core_days']:.6f} "
                    f"({goodput.describe(result['time'])})",
                    f"TensorBoard: {workdir.tensorboard_command()}"]))


if __name__ == "__main__":
  cli.run(main)
