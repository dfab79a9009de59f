"""python -m vit_jax.main --config=configs/digits.py --workdir=DIR [--config.KEY=VALUE ...]

On a pod every host runs this same command. `jax.distributed` is initialised
on its own on Cloud TPU VMs; elsewhere (several processes on one machine, as
launch/local_pod.sh starts them) the coordinator flags below say who is who.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

import os  # pylint: disable=g-import-not-at-top,wrong-import-position

import jax
from absl import flags, logging
from ml_collections import config_flags

from vit_jax import cli, runtime, train

config_flags.DEFINE_config_file("config", None, "An ml-collections config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, logs and metrics go.")
flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Initialise jax.distributed: 'auto' does when --coordinator_address is "
    "given or on a Cloud TPU VM (whose slice JAX describes by itself).")
flags.DEFINE_string("coordinator_address", None,
                    "host:port of process 0, e.g. 127.0.0.1:12345.")
flags.DEFINE_integer("num_processes", None, "How many processes in all.")
flags.DEFINE_integer("process_id", None, "This process's index, from 0.")
flags.mark_flags_as_required(["config", "workdir"])


def initialize_distributed():
  """Joins the processes of a pod, before JAX touches any device."""
  f = flags.FLAGS
  wanted = {"on": True, "off": False}.get(
      f.distributed, bool(f.coordinator_address) or runtime.on_tpu_host())
  if not wanted:
    return
  if jax.config.jax_platforms == "cpu" or os.environ.get(
      "JAX_PLATFORMS") == "cpu":
    # Collectives across CPU processes (the emulated pod) go through gloo.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f.coordinator_address,
                             num_processes=f.num_processes,
                             process_id=f.process_id)
  logging.info("Process %d of %d, %d of %d devices local",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def prepare():
  """What every entry point that trains does first: accelerators for JAX
  alone, the input pipeline's heap kept, and the pod's processes joined."""
  runtime.hide_accelerators_from_tensorflow()
  runtime.keep_freed_memory()
  initialize_distributed()


def main(argv):
  del argv  # cli.run refuses positional arguments.
  prepare()
  workdir = flags.FLAGS.workdir
  result = train.train_and_evaluate(flags.FLAGS.config, workdir)
  logging.info("final metrics: %s", result)
  if jax.process_index() > 0:
    return
  if "stopped_at_step" in result:
    print(f"stopped at step {result['stopped_at_step']}: checkpoint saved in "
          f"{os.path.abspath(workdir)}; run the same command to resume")
    return
  # What the evaluators measured last: their names prefix their metrics.
  prefixes = tuple(f"{name}{sep}" for name in flags.FLAGS.config.evaluators
                   for sep in "_/")
  scores = [f"{key} {value:.4f}" for key, value in sorted(result.items())
            if key.startswith(prefixes)]
  print(" | ".join([*scores, f"core_days {result['core_days']:.6f}",
                    f"TensorBoard: tensorboard --logdir "
                    f"{os.path.abspath(workdir)}"]))


if __name__ == "__main__":
  cli.run(main)
