r"""python -m vit_jax.vtab: the 19 VTAB-1k tasks from one checkpoint, as a table.

  python -m vit_jax.vtab --config=configs/vtab.py:L/16 --workdir=DIR \
      --config.init_from=CHECKPOINT --config.data_dir=DATA_DIR \
      [--tasks=all|natural|specialized|structured|TASK,...] [--val]

Each task is fine-tuned from the checkpoint on its 1,000 training examples
(train800val200) in DIR/<task>, an ordinary run that the same command
resumes, and scored on its test split. With --val it trains on train800 and
scores val200 instead, to choose hyper-parameters. DIR/vtab.md and
DIR/vtab.json then hold each task's top-1 accuracy, each group's mean and
the mean over the tasks (vit_jax/training/finetune_suite.py): Table 2's
VTAB row is the mean over all 19.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax import cli, paths
from vit_jax.cli import shared_flags
from vit_jax.data import vtab_tasks as registry
from vit_jax.training import finetune_suite

shared_flags.define_training()
flags.DEFINE_string("tasks", "all", "Comma-separated task names "
                    f"({', '.join(registry.TASKS)}), group names "
                    f"({', '.join(registry.GROUPS)}) or 'all'.")
flags.DEFINE_bool("val", False, "Train on train800 and score val200 (to "
                  "choose hyper-parameters) instead of train800val200 and "
                  "test.")


def main(argv):
  del argv  # cli.run refuses positional arguments.
  shared_flags.prepare_to_train()
  f = flags.FLAGS
  paths.check_reachable(f.workdir, "--workdir", writes=True)
  summary = finetune_suite.run(f.config, f.workdir, registry.select(f.tasks),
                           f.val)
  if summary is None:
    print("stopped: run the same command to resume")
    return
  finetune_suite.write(summary, f.workdir)
  print(finetune_suite.markdown(summary))
  print(f"written to {paths.shown(paths.join(f.workdir, 'vtab.md'))} "
        "and vtab.json")


if __name__ == "__main__":
  cli.run(main)
