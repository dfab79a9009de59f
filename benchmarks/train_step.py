"""How close the train step comes to the machine's rate.

  python benchmarks/train_step.py [--json] [--models=Ti/16:32,B/16:16]
      [--dtypes=float32,bfloat16] [--attention=einsum,fused] [--steps=7]
      [--set=optimizer.mu_dtype=bfloat16,...]
  python benchmarks/train_step.py --models=digits:128 --dtypes=float32 \
      --attention=einsum,fused --steps=50

In one process, for each MODEL:BATCH at 224 px (or `digits`, the model
of configs/digits.py at its 8 px), each compute dtype and each
attention implementation (`config.model.attention`): the project's own
train step (`step_lib.build`: the jitted step with its shardings, Adam, on
all the devices JAX sees), timed after two warm-up steps as the median of
--steps. Achieved FLOP/s counts the analytic training FLOPs of
`vit_jax.models.flops` (3 x forward). A batch that does not fit in the
devices' memory is reported as such, and the next one is tried.

On a GPU or TPU, `MFU` is that over the devices' dense bfloat16 peak
(`throughput.PEAK_FLOPS_PER_DEVICE`). On a CPU, `of matmul` is that over the
machine's dense float32 matmul rate (a large `jnp.dot` on one device, the
best of three runs with each kernel), measured right after each timed step
and reported as the median: this machine's speed drifts within minutes
(the lone matmul: 114 to 158 GFLOP/s in an hour), and interleaved, both
figures see the same drift. The step runs under the CPU settings that
`vit_jax.main` uses (`vit_jax.runtime`, applied first); each matmul sample
is the faster of Eigen's and YNNPACK's kernels, whichever those settings
pick for the step.
Run it with nothing else on the machine. Not run by the tests.
"""

import json
import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_list("models", ["Ti/16:32", "B/16:16"], "MODEL:BATCH pairs.")
flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "Compute dtypes.")
flags.DEFINE_list("attention", ["einsum"], "config.model.attention values "
                  "(auto: as a run on these devices resolves it).")
flags.DEFINE_integer("image_size", 224, "Image side in pixels.")
flags.DEFINE_integer("steps", 7, "Timed steps; the median is reported.")
flags.DEFINE_integer("matmul_size", 4096, "Side of the square matmul.")
flags.DEFINE_list("set", [], "KEY=VALUE config keys set for every "
                  "configuration, e.g. optimizer.mu_dtype=bfloat16.")
flags.DEFINE_bool("json", False, "One JSON object per configuration.")


def config_for(name, batch, dtype, image_size, attention="einsum",
               overrides=()):
  """MODEL at image_size, or for "digits" configs/digits.py's model at its
  8 px; then each "KEY=VALUE" of overrides, the value read as the key's
  default's type."""
  from configs import base, digits  # pylint: disable=g-import-not-at-top
  if name == "digits":
    config = digits.get_config()
  else:
    config = base.get_config()
    config.image_size = image_size
    config.model.name = name
  config.model.dtype = dtype
  config.model.attention = attention
  config.batch_size = batch
  config.total_steps = 10_000  # Past the warm-up, whatever --steps is.
  config.optimizer.update(name="adam", learning_rate=1e-4, warmup_steps=10,
                          decay="cosine")
  for override in overrides:
    key, value = override.split("=", 1)
    *parents, leaf = key.split(".")
    node = config
    for parent in parents:
      node = node[parent]
    kind = type(node[leaf])
    node[leaf] = (value.lower() == "true" if kind is bool
                  else value if node[leaf] is None else kind(value))
  return config


def settings_on_devices(config):
  """The config's Settings with its model's attention as a run on these
  devices resolves "auto" (training/fitting.py; resolve.py itself needs
  TensorFlow, which a GPU image may not have). remat "auto" keeps every
  activation off TPUs, as here."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.runs import settings
  from vit_jax.training import fitting
  keys = settings.of(config)
  return dataclasses.replace(keys, model=dataclasses.replace(
      keys.model, attention=fitting.attention(keys.model, jax.devices()[0])))


def prepared_step(config, num_classes=1000):
  """The run's jitted train step, a fresh state and a fixed random batch."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import sharding
  from vit_jax.training import step as step_lib
  keys = settings_on_devices(config)
  program = step_lib.build(keys, sharding.make_mesh(config.mesh),
                           step_lib.parts(keys, num_classes))
  state = program.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  size = config.image_size
  batch = place(program.batch_sharding,
                rng.integers(0, 256, (config.batch_size, size, size, 3),
                             np.uint8),
                rng.integers(0, num_classes, config.batch_size, np.int32))
  return program.train_step, state, batch


def place(batch_sharding, images, labels):
  """A batch of every row, laid out as the input pipeline lays one out,
  without importing TensorFlow (a GPU image may have none)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import sharding  # pylint: disable=g-import-not-at-top
  return sharding.to_global({"image": images, "label": labels,
                             "mask": np.ones(len(labels), np.float32)},
                            batch_sharding)


def time_train_step(config, steps, matmul, warmup=2):
  """Medians of the run's train step's seconds on a fixed random batch and
  of `matmul`'s FLOP/s (None: no matmul), measured right after each timed
  step."""
  import jax  # pylint: disable=g-import-not-at-top
  step, state, batch = prepared_step(config)
  times, rates = [], []
  for i in range(warmup + steps):
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    if i >= warmup:
      times.append(time.perf_counter() - start)
      if matmul:
        rates.append(matmul.measure(repeats=3))
  return statistics.median(times), rates and statistics.median(rates)


def out_of_memory(error):
  return "RESOURCE_EXHAUSTED" in str(error) or "Out of memory" in str(error)


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.models import flops as flops_lib
  from vit_jax.training import throughput
  f = flags.FLAGS
  on_cpu = jax.devices()[0].platform == "cpu"
  matmul = throughput.MatmulRate(f.matmul_size) if on_cpu else None
  peak = None if on_cpu else throughput.peak_flops_per_device()[0]
  rows = []
  for entry in f.models:
    name, batch = entry.split(":")
    for dtype in f.dtypes:
      for attention in f.attention:
        config = config_for(name, int(batch), dtype, f.image_size, attention,
                            f.set)
        keys = settings_on_devices(config)
        row = {"model": name, "image_size": config.image_size,
               "batch": config.batch_size, "dtype": dtype,
               "attention": attention,
               "resolved": keys.model.attention,
               "set": f.set,
               "devices": jax.device_count()}
        try:
          seconds, matmul_rate = time_train_step(config, f.steps, matmul)
        except Exception as e:  # pylint: disable=broad-except
          # Reported, and the next configuration tried: a kernel that does
          # not take this shape, a batch too large for the memory.
          row.update(fits=False, error=str(e).strip().splitlines()[0][:200],
                     out_of_memory=out_of_memory(e))
        else:
          flops = flops_lib.flops_per_image(keys.model, config.image_size,
                                            train=True)
          achieved = flops * config.batch_size / seconds
          row.update(fits=True, step_seconds=seconds,
                     img_per_sec=config.batch_size / seconds,
                     flops_per_sec=achieved,
                     matmul_flops_per_sec=matmul_rate,
                     ratio=achieved / (matmul_rate or peak or float("nan")))
        rows.append(row)
        if f.json:
          print(json.dumps(row), flush=True)
  if f.json:
    return
  against = (f"matmul: float32, {f.matmul_size}^2, one device" if on_cpu
             else "MFU: of the dense bfloat16 peak of the devices")
  print(f"{jax.device_count()} device(s) of {jax.devices()[0].device_kind}; "
        f"{against}\n")
  print("| model | px | batch | dtype | attention | step s | img/s "
        f"| TFLOP/s | {'of matmul' if on_cpu else 'MFU'} |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    head = (f"| {r['model']} | {r['image_size']} | {r['batch']} "
            f"| {r['dtype']} | {r['attention']} ")
    if not r["fits"]:
      print(head + ("| does not fit | | | |" if r["out_of_memory"]
                    else f"| error: {r['error']} | | | |"))
      continue
    print(head + f"| {r['step_seconds']:.3f} | {r['img_per_sec']:.1f} "
          f"| {r['flops_per_sec'] / 1e12:.2f} | {100 * r['ratio']:.0f}% |")


if __name__ == "__main__":
  from vit_jax import runtime
  runtime.apply()
  app.run(main)
