"""python -m vit_jax.plan --config=CONFIG --topology=v3-512 [--json] [--config.KEY=VALUE ...]

What a config will cost on a TPU v3 slice: HBM per core, step time, MFU
and TPUv3-core-days, from the config's train step compiled ahead of time
for the slice on this host's CPU (vit_jax/planning.py), and what would make
a config that does not fit fit.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli, runtime
  runtime.compile_ahead_of_time()
  cli.prepare()

import json  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags
from ml_collections import config_flags

from vit_jax import cli, planning

config_flags.DEFINE_config_file(
    "config", None, "An ml-collections config file.", lock_config=True)
flags.DEFINE_string("topology", "v3-8", "A Cloud TPU v3 slice (v3-8, v3-32, "
                    "..., v3-2048) or chip grid (v3:16x16).")
flags.DEFINE_integer("num_classes", 0, "The head's classes; default: the "
                     "dataset's.")
flags.DEFINE_float("overhead", planning.DEFAULT_OVERHEAD, "Allowance on top "
                   "of the training steps for evaluation, checkpoints and "
                   "restarts.")
flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv  # cli.run refuses positional arguments.
  f = flags.FLAGS
  result = planning.plan(f.config, f.topology, f.num_classes, f.overhead)
  config_name = config_flags.get_config_filename(f["config"])
  if f.json:
    print(json.dumps({"config": config_name, **result.to_json()}))
  else:
    print(planning.describe(config_name, result))


if __name__ == "__main__":
  cli.run(main)
