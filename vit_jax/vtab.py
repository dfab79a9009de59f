"""python -m vit_jax.vtab: the 19 VTAB-1k tasks from one checkpoint, as a table.

  python -m vit_jax.vtab --config=configs/vtab.py:L/16 --workdir=DIR \
      --config.init_from=CHECKPOINT --config.data_dir=DATA_DIR \
      [--tasks=all|natural|specialized|structured|TASK,...] [--val]

Each task is fine-tuned from the checkpoint on its 1,000 training examples
(train800val200) in DIR/<task>, an ordinary run that the same command
resumes, and scored on its test split. With --val it trains on train800 and
scores val200 instead, to choose hyper-parameters. DIR/vtab.md and
DIR/vtab.json then hold each task's top-1 accuracy, each group's mean and
the mean over the tasks: Table 2's VTAB row is the mean over all 19.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import os

import jax
from absl import flags, logging

from vit_jax import cli, errors, main as main_lib, train
from vit_jax.datasets import vtab as registry

GROUP_TITLES = {registry.NATURAL: "Natural",
                registry.SPECIALIZED: "Specialized",
                registry.STRUCTURED: "Structured"}


def select(spec):
  """"natural,clevr_count" -> those Tasks, in the paper's order."""
  wanted = set()
  for part in (p.strip() for p in spec.split(",") if p.strip()):
    if part == "all":
      wanted |= set(registry.TASKS)
    elif part in registry.GROUPS:
      wanted |= {t.name for t in registry.by_group()[part]}
    else:
      wanted.add(registry.get(part).name)  # A ValueError naming the tasks.
  if not wanted:
    raise errors.InputError("--tasks names no task")
  return [task for name, task in registry.TASKS.items() if name in wanted]


def task_config(config, task, val=False):
  """`config` (the task-independent fine-tuning settings) for one task:
  its data, its training split and the split it is scored on."""
  config = config.copy_and_resolve_references()
  config.dataset = f"vtab:{task.name}"
  config.train_split = task.splits["train800" if val else "train800val200"]
  name = "val" if val else "test"
  config.evaluators = {name: dict(
      kind="accuracy", every=config.total_steps,
      split=task.splits["val200" if val else "test"])}
  return config


def run(config, workdir, tasks, val=False):
  """Fine-tunes and scores each task in workdir/<task>; returns the summary
  that `write` tabulates. A finished task is scored, not trained again."""
  split = "val200" if val else "test"
  accuracies = {}
  for task in tasks:
    logging.warning("VTAB task %s (%s)", task.name, task.title)
    result = train.train_and_evaluate(task_config(config, task, val),
                                      os.path.join(workdir, task.name))
    if "stopped_at_step" in result:
      return None  # Preempted: the same command resumes this task.
    accuracies[task.name] = result[("val" if val else "test") + "_accuracy"]
  return summarise(accuracies, split)


def summarise(accuracies, split):
  """Per-task accuracy, each group's mean and the mean over the tasks."""
  tasks = [registry.get(name) for name in accuracies]
  groups = {}
  for group in registry.GROUPS:
    scores = [accuracies[t.name] for t in tasks if t.group == group]
    if scores:
      groups[group] = sum(scores) / len(scores)
  return {
      "split": split,
      "tasks": {t.name: {"title": t.title, "group": t.group,
                         "accuracy": accuracies[t.name]} for t in tasks},
      "groups": groups,
      "mean": sum(accuracies.values()) / len(accuracies),
      "num_tasks": len(accuracies),
      "complete": len(accuracies) == len(registry.TASKS),
  }


def markdown(summary):
  lines = [f"VTAB-1k top-1 accuracy (%) on {summary['split']}", "",
           "| Group | Task | Top-1 |", "|---|---|---:|"]
  for group, mean in summary["groups"].items():
    for task in summary["tasks"].values():
      if task["group"] == group:
        lines.append(f"| {GROUP_TITLES[group]} | {task['title']} | "
                     f"{100 * task['accuracy']:.2f} |")
    lines.append(f"| {GROUP_TITLES[group]} | **mean** | **{100 * mean:.2f}** |")
  lines.append(f"| All | **mean of {summary['num_tasks']}** | "
               f"**{100 * summary['mean']:.2f}** |")
  if not summary["complete"]:
    lines += ["", f"Only {summary['num_tasks']} of the "
              f"{len(registry.TASKS)} tasks: not comparable with Table 2."]
  return "\n".join(lines) + "\n"


def write(summary, workdir):
  """DIR/vtab.md and DIR/vtab.json (process 0 only)."""
  if jax.process_index() > 0:
    return
  with open(os.path.join(workdir, "vtab.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(workdir, "vtab.md"), "w") as f:
    f.write(markdown(summary))


def main(argv):
  del argv  # cli.run refuses positional arguments.
  main_lib.prepare()
  f = flags.FLAGS
  summary = run(f.config, f.workdir, select(f.tasks), f.val)
  if summary is None:
    print("stopped: run the same command to resume")
    return
  write(summary, f.workdir)
  print(markdown(summary))
  print(f"written to {os.path.join(os.path.abspath(f.workdir), 'vtab.md')} "
        "and vtab.json")


def define_flags():
  # Here, not at import: configs/vtab.py imports this module for
  # task_config, and a second import would define the flags twice.
  flags.DEFINE_string("tasks", "all", "Comma-separated task names "
                      f"({', '.join(registry.TASKS)}), group names "
                      f"({', '.join(registry.GROUPS)}) or 'all'.")
  flags.DEFINE_bool("val", False, "Train on train800 and score val200 (to "
                    "choose hyper-parameters) instead of train800val200 and "
                    "test.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
