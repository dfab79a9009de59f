"""python -m vit_jax.plan --config=CONFIG --topology=v4-128 [--json] [--config.KEY=VALUE ...]
python -m vit_jax.plan --config=CONFIG --compare=v3-256,v4-128,v5p-128,v6e-64 [--json]
python -m vit_jax.plan --config=CONFIG --topology=v5p-1024 --slices=2 [--dcn_gbps_per_chip=G]
python -m vit_jax.plan --config=CONFIG --cheapest=v5p [--json]

What a config will cost on a TPU slice of any generation from v3 to TPU7x:
HBM per device, step time, MFU and chip-hours (on v3 also TPUv3-core-days),
from the config's train step compiled ahead of time for the slice on this
host's CPU (vit_jax/planning/), and what would make a config that does
not fit fit. --compare plans it on several slices and prints one table;
--cheapest=GENERATION on each of a generation's slices that can run it,
marking the one of fewest expected chip-hours.
--slices=N plans it over N such slices joined by the data-center network,
with the time of what crosses it.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli, runtime
  runtime.compile_ahead_of_time()
  cli.prepare()

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import sys  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags
from ml_collections import config_flags

from vit_jax import cli, errors
from vit_jax.planning import cost as cost_lib, report

config_flags.DEFINE_config_file(
    "config", None, "An ml-collections config file.", lock_config=True)
flags.DEFINE_string("topology", "v3-8", "A Cloud TPU slice: v3-N, v4-N, "
                    "v5p-N, v5litepod-N (or v5e-N), v6e-N, tpu7x-N, such as "
                    "v4-128; or a chip grid such as v3:16x16 or v4:4x4x4.")
flags.DEFINE_list("compare", None, "Slices to plan the config on instead of "
                  "--topology, as one table (--json: a list of objects).")
flags.DEFINE_string("cheapest", None, "A TPU generation (v3, v4, v5p, v5e, "
                    "v6e, tpu7x): plan the config on each of its slices "
                    "that can run it, as one table, and mark the one of "
                    "fewest expected chip-hours.")
flags.DEFINE_integer("slices", 1, "How many such slices the run spans, "
                     "joined by the data-center network (multislice; the "
                     "data axis crosses between them).")
flags.DEFINE_float("dcn_gbps_per_chip", None, "Data-center network Gbit/s "
                   "per chip over several slices; default: Cloud TPU's "
                   "published figure (v5p, v5e).")
flags.DEFINE_integer("num_classes", 0, "The head's classes; default: the "
                     "dataset's.")
flags.DEFINE_float("overhead", cost_lib.DEFAULT_OVERHEAD, "Allowance on top "
                   "of the training steps for evaluation, checkpoints and "
                   "restarts.")
flags.DEFINE_bool("json", False, "Print JSON instead of text.")
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv  # cli.run refuses positional arguments.
  f = flags.FLAGS
  config_name = config_flags.get_config_filename(f["config"])
  dcn = f.dcn_gbps_per_chip and f.dcn_gbps_per_chip * 1e9
  given = [name for name in ("topology", "compare", "cheapest")
           if f[name].present]
  if len(given) > 1:
    raise errors.InputError(
        f"give one of --topology, --compare and --cheapest, not "
        f"{' and '.join('--' + name for name in given)}")
  if f.cheapest or f.compare:  # One table of several slices.
    best = None
    if f.cheapest:
      if f.slices != 1:
        raise errors.InputError("--cheapest plans single slices: leave out "
                                "--slices")
      results, best = cost_lib.cheapest(
          f.config, f.cheapest, f.num_classes, f.overhead,
          say=lambda line: print(line, file=sys.stderr, flush=True))
    else:
      results = cost_lib.compare(f.config, f.compare, f.num_classes,
                                 f.overhead, f.slices, dcn)
    if f.json:
      marked = lambda i: {"cheapest": i == best} if f.cheapest else {}
      print(json.dumps([{"config": config_name, **result.to_json(),
                         **marked(i)} for i, result in enumerate(results)]))
    else:
      print(report.describe_comparison(config_name, results, best))
    return
  result = cost_lib.plan(f.config, f.topology, f.num_classes, f.overhead,
                         f.slices, dcn)
  if f.json:
    print(json.dumps({"config": config_name, **result.to_json()}))
  else:
    print(report.describe(config_name, result))


if __name__ == "__main__":
  cli.run(main)
