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
import math  # pylint: disable=g-import-not-at-top,wrong-import-position
import sys  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags
from ml_collections import config_flags

from vit_jax import cli, errors
from vit_jax.planning import cost as cost_lib, report
from vit_jax.runs import settings

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
                     "data axis crosses between them).", lower_bound=1)
flags.DEFINE_float("dcn_gbps_per_chip", None, "Data-center network Gbit/s "
                   "per chip over several slices; default: Cloud TPU's "
                   "published figure (v5p, v5e).")
flags.register_validator(
    "dcn_gbps_per_chip", lambda v: v is None or 0 < v < math.inf,
    "give the Gbit/s per chip between slices, a number above 0, such as 50")
flags.DEFINE_integer("num_classes", 0, "The head's classes; default: the "
                     "dataset's.", lower_bound=0)
flags.DEFINE_float("overhead", cost_lib.DEFAULT_OVERHEAD, "Allowance on top "
                   "of the training steps for evaluation, checkpoints and "
                   "restarts, as a share of their time (0.05: 5%).")
flags.register_validator(
    "overhead", lambda v: 0 <= v < math.inf,
    "give the allowance as a share of the training steps' time, 0 or more, "
    f"such as {cost_lib.DEFAULT_OVERHEAD} ({cost_lib.DEFAULT_OVERHEAD:.0%})")
flags.DEFINE_bool("json", False, "Print JSON instead of text.")
flags.mark_flags_as_required(["config"])

# What --topology, --compare and --cheapest take, for a value left empty.
_WANTED = {"topology": "a Cloud TPU slice, such as v4-128",
           "compare": "slices, such as v3-256,v4-128",
           "cheapest": "a TPU generation, such as v5p"}


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
  # Each flag checked here, before any compile.
  for name in given:
    if not f[name].value:  # --compare= would plan the default topology.
      raise errors.InputError(f"--{name} is empty: give "
                              + _WANTED[name])
  if f.dcn_gbps_per_chip is not None and f.slices == 1:
    raise errors.InputError(
        f"--dcn_gbps_per_chip={f.dcn_gbps_per_chip:g} is the bandwidth "
        "between slices, which a plan of one slice does not use: leave it "
        "out, or plan several with --slices")
  keys = settings.of(f.config)  # The config as a run takes it.
  if f.cheapest or f.compare:  # One table of several slices.
    best, left_out = None, []
    if f.cheapest:
      if f.slices != 1:
        raise errors.InputError("--cheapest plans single slices: leave out "
                                "--slices")
      results, best, left_out = cost_lib.cheapest(
          keys, f.cheapest, f.num_classes, f.overhead,
          say=lambda line: print(line, file=sys.stderr, flush=True))
    else:
      results = cost_lib.compare(keys, f.compare, f.num_classes,
                                 f.overhead, f.slices, dcn)
    if f.json:
      marked = lambda i: {"cheapest": i == best} if f.cheapest else {}
      print(json.dumps([{"config": config_name, **result.to_json(),
                         **marked(i)} for i, result in enumerate(results)]))
      # The rows are the slices planned; those left out, beside them.
      for line in report.describe_left_out(left_out):
        print(line, file=sys.stderr)
    else:
      print(report.describe_comparison(config_name, results, best, left_out))
    return
  result = cost_lib.plan(keys, f.topology, f.num_classes, f.overhead,
                         f.slices, dcn)
  if f.json:
    print(json.dumps({"config": config_name, **result.to_json()}))
  else:
    print(report.describe(config_name, result))


if __name__ == "__main__":
  cli.run(main)
