r"""Images per second of an exported model on this machine: the StableHLO
export run by vit_jax/serving.py, the ONNX export run by ONNX Runtime, and
vit_jax.predict's own jitted model, on the same pixels.

  python benchmarks/exports.py [--model=B/16] [--batches=1,32] [--seconds=20]

The model has random weights (speed does not depend on them) and 1000
classes at 224 px. Each runtime runs each batch once to compile, then as
many times as fit in --seconds; the table shows the median images per
second. Export times are printed too.
"""

import dataclasses
import statistics
import tempfile
import time

from absl import app, flags

flags.DEFINE_string("model", "B/16", "A ViT name (models.VARIANTS).")
flags.DEFINE_integer("image_size", 224, "Pixels per side.")
flags.DEFINE_list("batches", ["1", "32"], "Images per call.")
flags.DEFINE_float("seconds", 20, "Time spent on each runtime and batch.")


def checkpoint(name, image_size):
  import flax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import pretrained  # pylint: disable=g-import-not-at-top
  model = models.create(name, num_classes=1000)
  params = flax.linen.meta.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)),
      train=False)["params"])
  params = jax.tree.map(np.asarray, params)
  return pretrained.Checkpoint(params, f"{name} (random weights)",
                               dict(models.FUNCTION_OPTIONS))


def rate(call, pixels, seconds):
  """Median images per second of call(pixels), after one call."""
  call(pixels)
  times = []
  end = time.perf_counter() + seconds
  while time.perf_counter() < end or len(times) < 3:
    start = time.perf_counter()
    call(pixels)
    times.append(time.perf_counter() - start)
  return len(pixels) / statistics.median(times)


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax import export as jax_export  # pylint: disable=g-import-not-at-top
  try:  # Not on every machine (a GPU image): its column is then left out.
    import jax2onnx  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    import onnxruntime  # pylint: disable=g-import-not-at-top
  except ImportError:
    onnxruntime = None

  from vit_jax import serving  # pylint: disable=g-import-not-at-top
  from vit_jax.analysis import classify  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import function_exports, pretrained  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  loaded = checkpoint(f.model, f.image_size)
  inference = pretrained.inference_of(loaded)
  # predict puts the params on the device once per command, not per batch.
  on_device = dataclasses.replace(inference,
                                  params=jax.device_put(inference.params))
  runtimes = {"predict (jit)": lambda pixels: classify.probabilities(
      on_device, pixels, len(pixels))}
  platform = jax_export.default_export_platform()
  with tempfile.TemporaryDirectory() as directory:
    # function_exports, not exports.write: no TensorFlow on a GPU image.
    start = time.perf_counter()
    function_exports.write_stablehlo(inference, f"{directory}/model.stablehlo",
                                     platforms=[platform])
    print(f"export stablehlo: {time.perf_counter() - start:.1f} s")
    if onnxruntime:
      start = time.perf_counter()
      function_exports.write_onnx(inference, f"{directory}/model.onnx")
      print(f"export onnx: {time.perf_counter() - start:.1f} s")
    served = serving.load(f"{directory}/model.stablehlo")
    runtimes["StableHLO (serving.py)"] = lambda pixels: served(pixels)
    if onnxruntime:
      session = onnxruntime.InferenceSession(f"{directory}/model.onnx")
      runtimes["ONNX Runtime (CPU)"] = lambda pixels: session.run(
          None, {"pixels": pixels})
    rng = np.random.default_rng(0)
    rows = []
    for batch in map(int, f.batches):
      pixels = rng.integers(0, 256, (batch, f.image_size, f.image_size, 3),
                            np.uint8)
      rows.append([rate(call, pixels, f.seconds)
                   for call in runtimes.values()])
  print(f"\n{f.model} at {f.image_size} px on {jax.devices()[0].device_kind}"
        ", images per second (median):")
  print("| batch | " + " | ".join(runtimes) + " |")
  print("|---" * (len(runtimes) + 1) + "|")
  for batch, row in zip(f.batches, rows):
    print(f"| {batch} | " + " | ".join(f"{r:,.1f}" for r in row) + " |")


if __name__ == "__main__":
  app.run(main)
