"""A short training run that needs no TensorFlow: the train step that
benchmarks/train_step.py times, trained on scikit-learn's digits.

  python benchmarks/short_run.py [--models=B/16:256] [--dtypes=bfloat16]
      [--attention=fused] [--image_size=224] [--train_steps=300]
      [--set=optimizer.mu_dtype=bfloat16]

For hosts whose image has JAX but not TensorFlow (a GPU image), where
`vit_jax.main` and its tf.data pipeline cannot run. The first of
--models, --dtypes and --attention is trained with train_step.py's config
(Adam at 1e-4, a 1000-class head), so the step is the one timed there and
its compiled program is JAX's cache's when the two share a cache. The
1,797 digits (8x8) are scaled to --image_size by repeating pixels; a fixed
fifth is held out. Each step gathers a random batch of the rest on the host
and lays it out as the input pipeline does.

Prints the mean training loss of every --log_every steps with its img/s
(the first interval holds the compilation), the img/s and MFU of the steps
after the first interval, and the top-1 accuracy on the held-out digits.
Not run by the tests.
"""

import os
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step as bench  # noqa: E402  (defines --models, --dtypes...)

flags.DEFINE_integer("train_steps", 300, "Steps to train.")
flags.DEFINE_integer("log_every", 50, "Steps per printed row.")


def digits(image_size, seed=0):
  """(train images, train labels, test images, test labels): uint8 RGB."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  scale = image_size // 8
  images = np.clip(data.images * 16, 0, 255).astype(np.uint8)
  images = images.repeat(scale, axis=1).repeat(scale, axis=2)
  images = np.pad(images, [(0, 0)] + [(0, image_size - 8 * scale)] * 2)
  images = np.repeat(images[..., None], 3, axis=-1)
  order = np.random.default_rng(seed).permutation(len(images))
  test, train = order[:len(order) // 5], order[len(order) // 5:]
  labels = data.target.astype(np.int32)
  return images[train], labels[train], images[test], labels[test]


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import sharding
  from vit_jax.models import flops as flops_lib
  from vit_jax.training import step as step_lib, throughput
  f = flags.FLAGS
  name, batch_size = f.models[0].split(":")
  config = bench.config_for(name, int(batch_size), f.dtypes[0],
                            f.image_size, f.attention[0], f.set)
  keys = bench.settings_on_devices(config)
  program = step_lib.build(keys, sharding.make_mesh(config.mesh),
                           step_lib.parts(keys, 1000))
  state = program.init(jax.random.key(0))
  train_images, train_labels, test_images, test_labels = digits(
      f.image_size)
  rng = np.random.default_rng(1)

  def place(images, labels):
    return bench.place(program.batch_sharding, images, labels)

  print(f"{name}, batch {config.batch_size}, {f.dtypes[0]}, attention "
        f"{f.attention[0]} ({keys.model.attention}), {f.image_size} px, "
        f"{' '.join(f.set)} on {jax.device_count()} "
        f"{jax.devices()[0].device_kind}", flush=True)
  losses, start, steady_start = [], time.perf_counter(), None
  for step in range(1, f.train_steps + 1):
    chosen = rng.integers(0, len(train_labels), config.batch_size)
    state, metrics = program.train_step(
        state, place(train_images[chosen], train_labels[chosen]))
    losses.append(metrics["train_loss"])
    if step % f.log_every == 0:
      loss = float(np.mean(jax.device_get(losses)))
      now = time.perf_counter()
      print(f"step {step}: loss {loss:.4f}, "
            f"{f.log_every * config.batch_size / (now - start):.0f} img/s",
            flush=True)
      losses, start = [], now
      steady_start = steady_start or (step, now)
  jax.block_until_ready(state)
  first, since = steady_start
  seconds = time.perf_counter() - since
  rate = (f.train_steps - first) * config.batch_size / seconds
  flops = flops_lib.flops_per_image(keys.model, f.image_size, train=True)
  peak = throughput.peak_flops_per_device()[0]
  print(f"steps {first + 1}-{f.train_steps}: {rate:.0f} img/s"
        + (f", MFU {rate * flops / (peak * jax.device_count()):.1%}"
           if peak else ""))

  predict = jax.jit(lambda params, images: program.model.apply(
      {"params": params}, images, train=False).argmax(-1))
  correct = 0
  for i in range(0, len(test_labels), config.batch_size):
    images = test_images[i:i + config.batch_size]
    padded = np.zeros((config.batch_size, *images.shape[1:]), np.uint8)
    padded[:len(images)] = images
    inputs = place(padded, np.zeros(config.batch_size, np.int32))["image"]
    predicted = np.asarray(predict(state.params, inputs))[:len(images)]
    correct += int((predicted == test_labels[i:i + len(images)]).sum())
  print(f"held-out top-1: {correct / len(test_labels):.1%} of "
        f"{len(test_labels)} digits")


if __name__ == "__main__":
  app.run(main)
