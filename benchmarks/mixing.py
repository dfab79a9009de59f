"""Where to mix a batch (Mixup, CutMix): on the device or on the host.

  python benchmarks/mixing.py [--batch_size=256] [--image_size=224]

Times mixing one host's batch (a v3-8 host's 256 images at 224 px) both
ways on this machine:

- device: vit_jax/training/targets.py's Recipe, jitted, on one device
  (here a CPU core), from the uint8 batch the host sends; on a TPU the
  same elementwise work is a few passes over the batch in HBM.
- host: the same arithmetic in numpy on the host after the pipeline, which
  must then send float32 (4 bytes a pixel instead of 1) and whose rows are
  only its own devices', so partners could not come from other hosts.

Prints ms per batch for each and the bytes each sends to the devices.
"""

import os
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_integer("batch_size", 256, "Images per host batch.")
flags.DEFINE_integer("image_size", 224, "Pixels a side.")
flags.DEFINE_integer("repeats", 10, "Timed repetitions (after one warm-up).")
FLAGS = flags.FLAGS


def timed(function, repeats):
  function()  # Compiles, warms caches.
  start = time.perf_counter()
  for _ in range(repeats):
    function()
  return (time.perf_counter() - start) / repeats


def host_mix(images, labels, num_classes, rng):
  """Mixup in numpy: float32 images in [-1, 1] and soft targets."""
  ratio = rng.beta(0.2, 0.2)
  unit = images.astype(np.float32) / 127.5 - 1
  onehot = np.eye(num_classes, dtype=np.float32)[labels]
  partner = np.roll(np.arange(len(labels)), -1)
  return (ratio * unit + (1 - ratio) * unit[partner],
          ratio * onehot + (1 - ratio) * onehot[partner])


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.training import targets  # pylint: disable=g-import-not-at-top
  n, side = FLAGS.batch_size, FLAGS.image_size
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)
  labels = rng.integers(0, 1000, n).astype(np.int32)
  recipe = targets.Recipe(num_classes=1000, mixup_prob=1.0, mixup_alpha=0.2)
  on_device = jax.device_put(images), jax.device_put(labels)
  mix = jax.jit(recipe)

  def device():
    jax.block_until_ready(mix(*on_device, jax.random.key(0)))

  device_s = timed(device, FLAGS.repeats)
  host_s = timed(lambda: host_mix(images, labels, 1000, rng), FLAGS.repeats)
  print(f"batch {n} x {side}x{side}x3, one {jax.devices()[0].platform} "
        f"device")
  print(f"device: {1e3 * device_s:.1f} ms per batch; sends uint8, "
        f"{images.nbytes / 2**20:.0f} MiB")
  print(f"host:   {1e3 * host_s:.1f} ms per batch of one host core; sends "
        f"float32, {4 * images.nbytes / 2**20:.0f} MiB")


if __name__ == "__main__":
  from vit_jax import runtime  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("XLA_FLAGS", f"{runtime.DEVICES_FLAG}=1")
  runtime.prepare()
  app.run(main)
