"""Plans every Table 2 config on a TPU slice: the cost tables of docs/plan.md.

  python benchmarks/table2_plans.py [--only=pretrain] [--json=FILE]
  python benchmarks/table2_plans.py --topologies=v4-512,v5p-128 [--json=FILE]

Runs `vit_jax.plan` (an ahead-of-time compile for the slice, on this CPU)
for the three pre-training configs and the fifteen fine-tuning configs of
Table 2, as they are, on the TPU v3 slices of PRETRAIN and FINETUNE below
(mesh: data x fsdp x model), and prints a markdown
table: slice, HBM per core, the compiler-estimated MFU, predicted
TPUv3-core-days, and the paper's core-days (pre-training only: Table 2
gives no fine-tuning cost).

--topologies plans the pre-training configs on their v3 slices and on each
of these slices of later generations instead, and prints two tables: one
row per config and slice (docs/plan.md), and the README's, one row per
config: predicted chip-hours and MFU on each slice beside the paper's
TPUv3-core-days.

Takes tens of minutes on 2 cores; not run by the tests.
"""

import dataclasses
import json
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vit_jax import runtime

runtime.compile_ahead_of_time()  # Before JAX is imported.
from configs.table2 import finetune, pretrain
from vit_jax.planning import catalogue, cost as cost_lib
from vit_jax.runs import settings

flags.DEFINE_enum("only", None, ["pretrain", "finetune"], "Plan one kind.")
flags.DEFINE_string("json", None, "Also write each plan as a JSON line here.")
flags.DEFINE_list("topologies", None, "Slices to plan the pre-training "
                  "configs on besides their v3 slices, such as "
                  "v4-512,v5p-128: the tables across TPU generations.")

# Table 2's core-days (docs/paper.md, Table 2): pre-training only.
PAPER_CORE_DAYS = {"H/14,jft": 2500, "L/16,jft": 680, "L/16,i21k": 230}

# config argument -> slice. Pre-training: H/14 needs v3-512 or more for its
# 4,096 batch at 8 images per core; L/16 gets 16 per core. Fine-tuning
# (batch 512): the smallest slice that fits.
PRETRAIN = {"H/14,jft": "v3-512", "L/16,jft": "v3-256", "L/16,i21k": "v3-256"}
FINETUNE_SLICES = {"H/14": "v3-64", "L/16": "v3-32"}
FINETUNE = {f"{column},{task},test": FINETUNE_SLICES[column.split("-")[0]]
            for column in finetune.COLUMNS for task in finetune.TASKS}


def step_shape(keys):
  """What a step's cost depends on, but for the head's class count."""
  return (keys.model, keys.image_size, keys.batch_size, keys.accum_steps,
          keys.mesh, keys.polyak_decay)


def rows(kind):
  """(kind, config argument, plan, the argument whose step it shares).

  Fine-tuning configs that differ only in their head (10 to 102 classes)
  and steps share one compiled step: its estimate times their own steps.
  """
  module, table = {"pretrain": (pretrain, PRETRAIN),
                   "finetune": (finetune, FINETUNE)}[kind]
  planned = {}
  for arg, slice_name in table.items():
    keys = settings.of(module.get_config(arg))
    key = (step_shape(keys), slice_name)
    if kind == "finetune" and key in planned:
      first, result = planned[key]
      yield kind, arg, dataclasses.replace(
          result, total_steps=keys.total_steps), first
      continue
    result = cost_lib.plan(keys, slice_name)
    planned[key] = (arg, result)
    yield kind, arg, result, None


def markdown_row(kind, arg, result, shared_with):
  gib = result.hbm_bytes_per_device / catalogue.GiB
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


def across_generations(topology_names):
  """(config argument, plan) of each pre-training config on its v3 slice
  and on each of `topology_names`, every slice checked (name, mesh layout)
  before the first compile."""
  slices = {arg: [v3_slice, *topology_names]
            for arg, v3_slice in PRETRAIN.items()}
  keys = {arg: settings.of(pretrain.get_config(arg)) for arg in slices}
  for arg, names in slices.items():
    for name in names:
      catalogue.check_layout(keys[arg].mesh, catalogue.topology(name))
  for arg, names in slices.items():
    for name in names:
      yield arg, cost_lib.plan(keys[arg], name)


def generations_row(arg, result):
  """A row of the table with one row per config and slice."""
  paper = PAPER_CORE_DAYS[arg] if result.generation == "v3" else None
  mesh = "x".join(str(size) for size in result.mesh.values())
  estimated = result.estimated_step_seconds is not None
  core_days = result.predicted_core_days
  return (f"| `pretrain.py:{arg}` | {result.topology} | {result.chips:,} | "
          f"{mesh} | {hbm(result)}"
          f"{'' if result.fits else ' (does not fit)'} | "
          f"{f'{result.mfu:.0%}' if estimated else '-'} | "
          f"{f'{result.estimated_step_seconds:.3f} s' if estimated else '-'} | "
          f"{f'{result.predicted_chip_hours:,.0f}' if estimated else '-'} | "
          f"{'-' if core_days is None else f'{core_days:,.1f}'} | "
          f"{'-' if paper is None else f'{paper:,}'} | "
          f"{result.compile_seconds + result.cost_compile_seconds:.0f} s |")


def hbm(result):
  return (f"{result.hbm_bytes_per_device / catalogue.GiB:.1f} of "
          f"{result.hbm_capacity_bytes / catalogue.GiB:.0f} GiB")


def readme_table(plans, topology_names):
  """One row per config: chip-hours (MFU) on each slice, the v3 slice
  first, beside the paper's TPUv3-core-days."""
  v3_slices = " / ".join(dict.fromkeys(PRETRAIN.values()))
  lines = [
      "| config | paper's TPUv3-core-days | predicted TPUv3-core-days | "
      + " | ".join([v3_slices, *topology_names]) + " |",
      "|---" * (3 + len(topology_names)) + "|---|"]
  for arg in PRETRAIN:
    results = [result for a, result in plans if a == arg]
    cells = [f"{r.predicted_chip_hours:,.0f} ({r.mfu:.0%})" if r.fits
             else f"does not fit ({hbm(r)})"
             for r in results]
    lines.append(f"| {arg} | {PAPER_CORE_DAYS[arg]:,} | "
                 f"{results[0].predicted_core_days:,.0f} | "
                 + " | ".join(cells) + " |")
  return "\n".join(lines)


def write_json(config_name, result):
  if flags.FLAGS.json:
    with open(flags.FLAGS.json, "a") as f:
      f.write(json.dumps({"config": config_name, **result.to_json()}) + "\n")


def main(argv):
  del argv
  if flags.FLAGS.topologies:
    print("| config | slice | chips | mesh | HBM per device | MFU (compiler) "
          "| step time | predicted chip-hours | predicted TPUv3-core-days | "
          "paper's TPUv3-core-days | compile |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    plans = []
    for arg, result in across_generations(flags.FLAGS.topologies):
      print(generations_row(arg, result), flush=True)
      write_json(f"pretrain.py:{arg}", result)
      plans.append((arg, result))
    print()
    print(readme_table(plans, flags.FLAGS.topologies))
    return
  kinds = [flags.FLAGS.only] if flags.FLAGS.only else ["pretrain", "finetune"]
  print("| config | slice | mesh | HBM per core | MFU (compiler) | "
        "predicted core-days | paper's core-days | compile |")
  print("|---|---|---|---|---|---|---|---|")
  for kind in kinds:
    for kind_, arg, result, shared_with in rows(kind):
      print(markdown_row(kind_, arg, result, shared_with), flush=True)
      write_json(f"{kind_}.py:{arg}", result)


if __name__ == "__main__":
  app.run(main)
