r"""What NaFlex costs in training: the share of tokens spent on padding in an
epoch of a folder of mixed aspect ratios, and the train step's throughput
per real token against square images of the same token count.

  python benchmarks/naflex.py [--model=S/16] [--budget=256] [--batch=16]
      [--images=256] [--steps=5]

The folder (written to a temporary directory) holds --images PNGs of
random pixels whose shapes cycle through ASPECTS (photos, portraits, wide
screens, documents, panoramas, squares), the long side drawn from 64 to 640
pixels. One epoch of it through the input pipeline
(`pipeline.train_dataset(naflex=...)`, as a run with
config.naflex.max_num_patches=--budget reads it) gives the padding share:
the budget's tokens that are no image's patches. The train step
(`step_lib.build`, Adam, all devices) is then timed on those batches and
on square images of side patch x sqrt(budget), the same tokens an image,
the two steps in turn after two warm-up steps each, as the median of
--steps; a real token is a patch of an image. Run it with nothing else on the machine. Not run by the
tests.
"""

import math
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_string("model", "S/16", "A ViT name (models.VARIANTS).")
flags.DEFINE_integer("budget", 256, "config.naflex.max_num_patches; a "
                     "square number, the square images' patches.")
flags.DEFINE_integer("batch", 16, "Images a step.")
flags.DEFINE_integer("images", 256, "Images in the folder.")
flags.DEFINE_integer("steps", 5, "Timed steps; the median is reported.")

# Height : width of the folder's images, in turn.
ASPECTS = [(3, 4), (4, 3), (9, 16), (16, 9), (1, 1), (1.414, 1), (1, 3),
           (10, 16), (2, 3), (3, 1)]
CLASSES = 4


def write_folder(root, count):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  for i in range(count):
    height, width = ASPECTS[i % len(ASPECTS)]
    side = rng.integers(64, 641)
    scale = side / max(height, width)
    shape = (max(1, round(height * scale)), max(1, round(width * scale)), 3)
    folder = os.path.join(root, str(i % CLASSES))
    os.makedirs(folder, exist_ok=True)
    tf.io.write_file(os.path.join(folder, f"{i}.png"), tf.io.encode_png(
        rng.integers(0, 256, shape, np.uint8)))


def config_for(model, batch, image_size, budget=0):
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.model.name = model
  config.image_size = image_size
  config.naflex.max_num_patches = budget
  config.batch_size = batch
  config.total_steps = 10_000
  config.optimizer.update(name="adam", learning_rate=1e-4, warmup_steps=10,
                          decay="cosine")
  return config


def step_and_state(config):
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax import sharding
  from vit_jax.runs import settings
  from vit_jax.training import step as step_lib
  keys = settings.of(config)
  program = step_lib.build(keys, sharding.make_mesh(config.mesh),
                           step_lib.parts(keys, CLASSES))
  return program, program.init(jax.random.key(0))


def interleaved_seconds(runs, steps):
  """Median seconds of each (program, state, batches) of `runs`'s train
  step, timed in turn step by step after two warm-up steps each, so that
  the machine's drift reaches every run alike."""
  import jax  # pylint: disable=g-import-not-at-top
  runs = [list(run) for run in runs]
  times = [[] for _ in runs]
  for i in range(2 + steps):
    for run, timed in zip(runs, times):
      program, state, batches = run
      start = time.perf_counter()
      state, metrics = program.train_step(state, batches[i % len(batches)])
      jax.block_until_ready((state, metrics))
      run[1] = state
      if i >= 2:
        timed.append(time.perf_counter() - start)
  return [statistics.median(timed) for timed in times]


def main(argv):
  del argv
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import models, runtime, sharding
  from vit_jax.data import pipeline, sources
  from vit_jax.models import naflex
  runtime.apply()
  f = flags.FLAGS
  side = math.isqrt(f.budget)
  if side * side != f.budget:
    raise app.UsageError("--budget must be a square number")
  patch = models.parse_name(f.model)[1]
  with tempfile.TemporaryDirectory() as root:
    write_folder(os.path.join(root, "images"), f.images)
    source = sources.lookup(f"folder:{os.path.join(root, 'images')}",
                            os.path.join(root, "data"))
    epoch = pipeline.train_dataset(
        source, "train", batch_size=f.batch, image_size=patch * side,
        naflex=naflex.Budget(patch, f.budget)).take(f.images // f.batch)
    rows = list(epoch.as_numpy_iterator())
  real = np.concatenate([batch["grid"].prod(axis=1) for batch in rows])
  padding = 1 - real.sum() / (len(real) * f.budget)
  print(f"{f.model}, {f.images} images of {len(ASPECTS)} aspect ratios, "
        f"budget {f.budget}: padding {padding:.1%} of an epoch's tokens "
        f"(an image's patches: {real.min()} to {real.max()}, mean "
        f"{real.mean():.1f})")

  flexible, state = step_and_state(
      config_for(f.model, f.batch, patch * side, f.budget))
  keep = ("image", "grid", "label", "mask")
  batches = [sharding.to_global({k: batch[k] for k in keep},
                                flexible.batch_sharding)
             for batch in rows[:4]]
  square, square_state = step_and_state(
      config_for(f.model, f.batch, patch * side))
  rng = np.random.default_rng(0)
  batch = sharding.to_global({
      "image": rng.integers(0, 256, (f.batch, patch * side, patch * side, 3),
                            np.uint8),
      "label": np.zeros(f.batch, np.int32),
      "mask": np.ones(f.batch, np.float32)}, square.batch_sharding)
  square_seconds, flex_seconds = interleaved_seconds(
      [(square, square_state, [batch]), (flexible, state, batches)], f.steps)
  mean_real = real.mean()
  flex_tokens = f.batch * mean_real / flex_seconds
  square_tokens = f.batch * f.budget / square_seconds
  print(f"square {patch * side} px: {f.batch / square_seconds:.2f} img/s, "
        f"{square_tokens:.0f} real tokens/s")
  print(f"NaFlex, budget {f.budget}: {f.batch / flex_seconds:.2f} img/s, "
        f"{flex_tokens:.0f} real tokens/s "
        f"({flex_tokens / square_tokens:.1%} of square's)")


if __name__ == "__main__":
  app.run(main)
