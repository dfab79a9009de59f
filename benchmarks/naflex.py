r"""Square, NaFlex and packed training on images of mixed sizes, compared.

  python benchmarks/naflex.py [--steps=150] [--data_dir=DIR]
      [--variants=square,naflex,packed,packed_drop]

Writes digits/mixed_sizes (the digits each at a size of its own: the
longer side 8-16 pixels, aspect ratios 1:3 to 3:1, 8 to 64 patches of 2 x
2) to a temporary folder of PNGs, train/ and test/ with a folder a class,
and trains each variant of configs/naflex/digits.py on it (dataset
folder:PATH) for --steps steps in this process, one after the other, each
in a temporary workdir:

  square       every image resized to 16 x 16 pixels: 64 patches
  naflex       every image enlarged or shrunk to fill 64 patches
  packed       each at its own size, about 2.5 a sequence of 64
  packed_drop  the same with a quarter of each image's patches dropped

and prints, from each run's metrics.jsonl, the median img/s per device of
its logged rows (the first, which compiles, left out), its sequences per
second where it packs, the share of its patch slots that hold no image
(packed: as logged; NaFlex: the grids' rounding over all the digits;
square: none), the share of the images read that found no room, and the
test accuracy at the end. Run it with nothing else on the machine; the
tests do not.
"""

import os
import statistics
import sys
import tempfile

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_integer("steps", 150, "Training steps of each run.")
flags.DEFINE_string("data_dir", "", "Where digits/mixed_sizes is prepared "
                    "(default: TFDS's); the folder's own is temporary.")
flags.DEFINE_list("variants", ["square", "naflex", "packed", "packed_drop"],
                  "configs/naflex/digits.py's variants to run.")


def naflex_padding(budget):
  """The share of NaFlex's patch slots that hold no image over the 1,797
  digits: each grid's rounding within the budget."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top
  from vit_jax.models import naflex  # pylint: disable=g-import-not-at-top
  filled = [np.prod(naflex.grid_for(*digits.mixed_size(i), 2, budget))
            for i in range(1797)]
  return 1 - np.mean(filled) / budget


def write_folder(root, data_dir):
  """root/{train,test}/<label>/<i>.png: digits/mixed_sizes's images."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top
  builder = sources.get_builder("digits/mixed_sizes", data_dir or None)
  for split in ("train", "test"):
    for i, example in enumerate(builder.as_data_source(split=split)):
      folder = os.path.join(root, split, str(example["label"]))
      os.makedirs(folder, exist_ok=True)
      tf.io.write_file(os.path.join(folder, f"{i}.png"),
                       tf.io.encode_png(example["image"]))


def train(variant, steps, dataset, data_dir, workdir):
  """The rows of metrics.jsonl of a run of `variant` on `dataset`."""
  from configs.naflex import digits as digits_config  # pylint: disable=g-import-not-at-top
  from vit_jax.runs import writers  # pylint: disable=g-import-not-at-top
  from vit_jax.training import loop, resolve  # pylint: disable=g-import-not-at-top
  config = digits_config.get_config(variant)
  config.dataset = dataset
  config.total_steps = steps
  config.evaluators.test.every = steps
  config.checkpoint_every = steps
  config.data_dir = data_dir
  loop.train_and_evaluate(resolve.run(config, workdir))
  return writers.read_rows(workdir)


def main(argv):
  del argv
  from vit_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.apply()
  f = flags.FLAGS
  print("| variant | img/s per device | seq/s per device | padding | "
        "left over | test accuracy |")
  print("|---|---:|---:|---:|---:|---:|")
  scratch = tempfile.TemporaryDirectory()
  folder = os.path.join(scratch.name, "digits")
  write_folder(folder, f.data_dir)
  for variant in f.variants:
    with tempfile.TemporaryDirectory() as workdir:
      rows = train(variant, f.steps, f"folder:{folder}",
                   os.path.join(scratch.name, "data"), workdir)
    logged = [row for row in rows if "img_per_sec_per_device" in row][1:]
    img = statistics.median(row["img_per_sec_per_device"] for row in logged)
    packed = "padding_fraction" in logged[0]
    seq = (f"{statistics.median(r['seq_per_sec_per_device'] for r in logged):,.0f}"
           if packed else "")
    padding = (statistics.mean(row["padding_fraction"] for row in logged)
               if packed else naflex_padding(64) if variant == "naflex"
               else 0.0)
    left_over = (f"{statistics.mean(r['dropped_fraction'] for r in logged):.1%}"
                 if packed else "")
    accuracy = [row["test_accuracy"] for row in rows
                if "test_accuracy" in row][-1]
    print(f"| {variant} | {img:,.0f} | {seq} | {padding:.1%} | {left_over} "
          f"| {accuracy:.3f} |", flush=True)


if __name__ == "__main__":
  app.run(main)
