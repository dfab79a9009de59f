"""A suite of fine-tunes: each VTAB-1k task from one checkpoint, then a table.

Each task trains on its 1,000 examples (train800val200) in WORKDIR/<task>,
an ordinary run that the same call resumes, and is scored on its test split;
with `val` it trains on train800 and is scored on val200, to choose
hyper-parameters. The summary holds each task's top-1 accuracy, each
group's mean and the mean over the tasks: Table 2's VTAB row is the mean
over all 19. `python -m vit_jax.vtab` is the command line.
"""

import json

import jax
from absl import logging

from vit_jax import paths
from vit_jax.data import vtab_tasks as registry
from vit_jax.training import loop, resolve

GROUP_TITLES = {registry.NATURAL: "Natural",
                registry.SPECIALIZED: "Specialized",
                registry.STRUCTURED: "Structured"}


def run(config, workdir, tasks, val=False):
  """Fine-tunes and scores each task in workdir/<task>; returns the summary
  that `write` tabulates. A finished task is scored, not trained again."""
  split = "val200" if val else "test"
  accuracies = {}
  for task in tasks:
    logging.warning("VTAB task %s (%s)", task.name, task.title)
    result = loop.train_and_evaluate(resolve.run(
        task_config(config, task, val),
        paths.join(workdir, task.name)))
    if "stopped_at_step" in result:
      return None  # Preempted: the same command resumes this task.
    accuracies[task.name] = result[("val" if val else "test") + "_accuracy"]
  return summarise(accuracies, split)


def task_config(config, task, val=False):
  """`config` (the task-independent fine-tuning settings) for one task:
  its data, its training split and the split it is scored on (val200 with
  `val`, to choose hyper-parameters; else test)."""
  config = config.copy_and_resolve_references()
  config.dataset = f"vtab:{task.name}"
  config.train_split = task.splits["train800" if val else "train800val200"]
  name = "val" if val else "test"
  config.evaluators = {name: dict(
      kind="accuracy", every=config.total_steps,
      split=task.splits["val200" if val else "test"])}
  return config


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
  """DIR/vtab.md and DIR/vtab.json (process 0 only), each replaced whole."""
  if jax.process_index() > 0:
    return
  paths.write_atomically(paths.join(workdir, "vtab.json"),
                         json.dumps(summary, indent=2))
  paths.write_atomically(paths.join(workdir, "vtab.md"), markdown(summary))
