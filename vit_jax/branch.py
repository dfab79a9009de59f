"""python -m vit_jax.branch --workdir=DIR [--step=N] --to=NEW

Starts a new workdir where a run stood at one of its checkpoints: NEW
holds that checkpoint (the whole train state: params, optimizer state,
step), the run's config as recorded and the metrics up to the step. Train
in NEW with the run's command and --workdir=NEW, changing what a restart
may change, and it resumes from the step.

What it is for: a warmup-stable-decay run (config.optimizer.decay="wsd")
keeps the checkpoint from which its decay starts; from it, decays of
other lengths or shapes branch without training the stable phase again:

  python -m vit_jax.branch --workdir=DIR --to=DIR_short
  python -m vit_jax.main --config=... --workdir=DIR_short \\
      --config.total_steps=T --config.optimizer.wsd_fraction=F

--step defaults to that kept checkpoint (a WSD run's `stable_end`). NEW
must hold no run. The TensorBoard events stay in DIR.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax import cli, errors, paths
from vit_jax.runs.workdir import Workdir
from vit_jax.training import optimizer

flags.DEFINE_string("workdir", None, "The run to branch from.")
flags.DEFINE_integer("step", None, "Its checkpoint to start from (default: "
                     "the step a WSD run's decay starts from).",
                     lower_bound=1)
flags.DEFINE_string("to", None, "The new workdir, which must hold no run.")
flags.mark_flags_as_required(["workdir", "to"])


def main(argv):
  del argv  # cli.run refuses positional arguments.
  f = flags.FLAGS
  paths.check_reachable(f.workdir, "--workdir")
  paths.check_reachable(f.to, "--to", writes=True)
  source, to = Workdir(f.workdir), Workdir(f.to)
  keys = source.read_config()
  step = f.step
  if step is None:
    step = optimizer.branch_step(keys.optimizer, keys.total_steps)
    if step is None:
      raise errors.InputError(
          f"{source} is no warmup-stable-decay run (its optimizer.decay is "
          f"{keys.optimizer.decay!r}): give the checkpoint with --step")
  steps = source.checkpoint_steps()
  if step not in steps:
    raise errors.InputError(
        f"{source} holds no complete checkpoint of step {step}; it holds "
        f"{', '.join(map(str, steps)) or 'none'}")
  if to.has_run() or to.checkpoint_steps():
    raise errors.InputError(f"--to={f.to} holds a run already: give a new "
                            "workdir")
  source.branch(step, to)
  print(f"{to} starts at step {step} of {source}: train in it with the "
        f"run's command and --workdir={paths.shown(f.to)}, and "
        "--config.total_steps or --config.optimizer.wsd_fraction for "
        "another decay")


if __name__ == "__main__":
  cli.run(main)
