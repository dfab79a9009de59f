"""Plans every Table 2 config on a TPU v3 slice: the cost tables of docs/plan.md.

  python benchmarks/table2_plans.py [--only=pretrain] [--json=FILE]

Runs `vit_jax.plan` (an ahead-of-time compile for the slice, on this CPU)
for the three pre-training configs and the fifteen fine-tuning configs of
Table 2, as they are, on the slices of PRETRAIN and FINETUNE below
(mesh: data x fsdp x model), and prints a markdown
table: slice, HBM per core, the compiler-estimated MFU, predicted
TPUv3-core-days, and the paper's core-days (pre-training only: Table 2
gives no fine-tuning cost). Takes tens of minutes on 2 cores; not run by
the tests.
"""

import dataclasses
import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vit_jax import runtime  # pylint: disable=g-import-not-at-top
runtime.compile_ahead_of_time()  # Before JAX is imported.
from configs.table2 import finetune, pretrain  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax import planning  # pylint: disable=g-import-not-at-top,wrong-import-position

flags.DEFINE_enum("only", None, ["pretrain", "finetune"], "Plan one kind.")
flags.DEFINE_string("json", None, "Also write each plan as a JSON line here.")

# Table 2's core-days (docs/paper.md, Table 2): pre-training only.
PAPER_CORE_DAYS = {"H/14,jft": 2500, "L/16,jft": 680, "L/16,i21k": 230}

# config argument -> slice. Pre-training: H/14 needs v3-512 or more for its
# 4,096 batch at 8 images per core; L/16 gets 16 per core. Fine-tuning
# (batch 512): the smallest slice that fits.
PRETRAIN = {"H/14,jft": "v3-512", "L/16,jft": "v3-256", "L/16,i21k": "v3-256"}
FINETUNE_SLICES = {"H/14": "v3-64", "L/16": "v3-32"}
FINETUNE = {f"{column},{task},test": FINETUNE_SLICES[column.split("-")[0]]
            for column in finetune.COLUMNS for task in finetune.TASKS}


def step_shape(config):
  """What a step's cost depends on, but for the head's class count."""
  return (config.model.to_json(), config.image_size, config.batch_size,
          config.accum_steps, config.mesh.to_json(), config.polyak_decay)


def rows(kind):
  """(kind, config argument, plan, the argument whose step it shares).

  Fine-tuning configs that differ only in their head (10 to 102 classes)
  and steps share one compiled step: its estimate times their own steps.
  """
  module, table = {"pretrain": (pretrain, PRETRAIN),
                   "finetune": (finetune, FINETUNE)}[kind]
  planned = {}
  for arg, slice_name in table.items():
    config = module.get_config(arg)
    key = (step_shape(config), slice_name)
    if kind == "finetune" and key in planned:
      first, result = planned[key]
      yield kind, arg, dataclasses.replace(
          result, total_steps=config.total_steps), first
      continue
    result = planning.plan(config, slice_name)
    planned[key] = (arg, result)
    yield kind, arg, result, None


def markdown_row(kind, arg, result, shared_with):
  gib = result.hbm_bytes_per_core / planning.GiB
  paper = PAPER_CORE_DAYS.get(arg) if kind == "pretrain" else None
  days = result.predicted_core_days
  mesh = "x".join(str(size) for size in result.mesh.values())
  # Compile times are this machine's, taken with nothing else running, for
  # the pre-training configs (the bar); "-" for the others.
  compiled = (f"{result.compile_seconds:.0f} s" if kind == "pretrain"
              else "-")
  if shared_with:
    compiled = f"step of `{shared_with}`"
  return (f"| `{kind}.py:{arg}` | {result.topology} | {mesh} | "
          f"{gib:.1f} GiB{'' if result.fits else ' (does not fit)'} | "
          f"{'-' if result.mfu is None else f'{result.mfu:.0%}'} | "
          f"{'-' if days is None else f'{days:,.1f}'} | "
          f"{'-' if paper is None else f'{paper:,}'} | {compiled} |")


def main(argv):
  del argv
  kinds = [flags.FLAGS.only] if flags.FLAGS.only else ["pretrain", "finetune"]
  print("| config | slice | mesh | HBM per core | MFU (compiler) | "
        "predicted core-days | paper's core-days | compile |")
  print("|---|---|---|---|---|---|---|---|")
  for kind in kinds:
    for kind_, arg, result, shared_with in rows(kind):
      print(markdown_row(kind_, arg, result, shared_with), flush=True)
      if flags.FLAGS.json:
        with open(flags.FLAGS.json, "a") as f:
          f.write(json.dumps({"config": f"{kind_}.py:{arg}",
                              **result.to_json()}) + "\n")


if __name__ == "__main__":
  app.run(main)
