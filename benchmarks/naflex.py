r"""NaFlex and packed training on images of mixed sizes, compared at equal
steps, at equal images seen and at equal FLOPs.

  python benchmarks/naflex.py [--steps=150] [--min_long_side=8]
      [--max_long_side=16] [--images_per_sequence=X] [--seeds=0,1]
      [--variants=naflex,packed,square,packed_drop] [--nocompare]

Writes the 1,797 digits each at a size of its own (the longer side
--min_long_side to --max_long_side pixels, both included, aspect ratios
1:3 to 3:1; at 8-16, the default, digits/mixed_sizes's images) to a
temporary folder of PNGs, train/ and test/ with a folder a class, and
trains variants of configs/naflex/digits.py on it (dataset folder:PATH),
one after the other in this process, each in a temporary workdir:

  naflex       every image enlarged or shrunk to fill 64 patches
  packed       each at its own size, packed into sequences of 64
               (naflex.images_per_sequence: the default, or
               --images_per_sequence)
  square       every image resized to 16 x 16 pixels: 64 patches
  packed_drop  packed, a quarter of each image's patches dropped, 3.2
               read a sequence

each for --steps steps (the warm-up a tenth of them, as the config's).
With `naflex` and `packed` both in --variants (and --compare, the
default) two more packed runs follow, their step counts taken from the
first two: one stopped at the images NaFlex saw (NaFlex's steps x batch
over the packed run's images a step), one at NaFlex's FLOPs (its steps x
flops_per_step over the packed run's, which counts each slot's class
token). Each is a run of its own, its schedule over its own steps.

Prints one row a run, from its metrics.jsonl: its steps, the images it
trained on (packed: images_per_step over its steps), the FLOPs of its
steps (flops_per_step x steps, padding included), the share of its patch
slots that hold no image (packed: as logged; NaFlex: its grids' rounding
over all the folder's images; square: none), the share of the images
read that found no room (packed), its test accuracy at the end (the mean
over --seeds, each seed's in brackets), and the median img/s per device
of its logged rows (the first, which compiles, left out). The 1-minute
load average is printed before the first run: where it is above a tenth
of a core, other work shared the CPU and the img/s are not clean
measurements.
"""

import os
import statistics
import sys
import tempfile

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_integer("steps", 150, "Training steps of each equal-steps run.")
flags.DEFINE_integer("min_long_side", 8, "The folder's images' longer "
                     "side, at least (pixels).")
flags.DEFINE_integer("max_long_side", 16, "The folder's images' longer "
                     "side, at most (pixels).")
flags.DEFINE_float("images_per_sequence", 0.0, "naflex.images_per_sequence "
                   "of the `packed` runs (0: the config's, the default).")
flags.DEFINE_list("seeds", ["0"], "config.seed of each run, one run a seed.")
flags.DEFINE_list("variants", ["naflex", "packed"],
                  "configs/naflex/digits.py's variants to run for --steps.")
flags.DEFINE_bool("compare", True, "With naflex and packed: also packed at "
                  "NaFlex's images seen and at NaFlex's FLOPs.")

BUDGET = 64  # configs/naflex/digits.py's max_num_patches


def sizes(long_sides):
  """(height, width) of each of the 1,797 digits in the folder."""
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top
  return [digits.mixed_size(i, long_sides) for i in range(1797)]


def naflex_padding(long_sides):
  """The share of NaFlex's patch slots that hold no image over the
  folder's digits: each grid's rounding within the budget."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax.models import naflex  # pylint: disable=g-import-not-at-top
  filled = [np.prod(naflex.grid_for(*size, 2, BUDGET))
            for size in sizes(long_sides)]
  return 1 - np.mean(filled) / BUDGET


def mean_patches(long_sides):
  """The mean patches of 2 x 2 of the folder's digits at their own size."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax.models import naflex  # pylint: disable=g-import-not-at-top
  return np.mean([np.prod(naflex.native_grid(*size, 2, BUDGET))
                  for size in sizes(long_sides)])


def write_folder(root, long_sides):
  """root/{train,test}/<label>/<i>.png: the digits at their sizes, with
  digits/mixed_sizes's train/test split."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from sklearn import datasets  # pylint: disable=g-import-not-at-top

  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top
  data = datasets.load_digits()
  size = sizes(long_sides)
  for split, indices in zip(("train", "test"),
                            digits.split_indices(data.target)):
    for index in indices:
      image = digits.to_uint8(data.images[index])[..., None]
      folder = os.path.join(root, split, str(data.target[index]))
      os.makedirs(folder, exist_ok=True)
      tf.io.write_file(os.path.join(folder, f"{index}.png"), tf.io.encode_png(
          digits.resized(image, size[index])))


def train(variant, steps, seed, per_sequence, dataset, data_dir):
  """The rows of metrics.jsonl of a run of `variant` on `dataset`."""
  from configs.naflex import digits as digits_config  # pylint: disable=g-import-not-at-top
  from vit_jax.runs import writers  # pylint: disable=g-import-not-at-top
  from vit_jax.training import loop, resolve  # pylint: disable=g-import-not-at-top
  config = digits_config.get_config(variant)
  config.dataset = dataset
  config.seed = seed
  if variant == "packed" and per_sequence:
    config.naflex.images_per_sequence = per_sequence
  config.optimizer.warmup_steps = max(1, round(
      config.optimizer.warmup_steps * steps / config.total_steps))
  config.total_steps = steps
  config.evaluators.test.every = steps
  config.checkpoint_every = steps
  config.data_dir = data_dir
  with tempfile.TemporaryDirectory() as workdir:
    loop.train_and_evaluate(resolve.run(config, workdir))
    rows = writers.read_rows(workdir)
  return rows, config.batch_size


def summary(rows, steps, batch_size):
  """What a run's rows say: steps, images, FLOPs, padding (None: not
  packed), left over, accuracy, img/s per device."""
  logged = [row for row in rows if "img_per_sec_per_device" in row]
  packed = "images_per_step" in logged[0]
  images, before = 0.0, 0
  for row in logged:  # Each row: the mean over the steps since the last.
    images += (row["images_per_step"] if packed else batch_size) * (
        row["step"] - before)
    before = row["step"]
  return {
      "steps": steps, "images": images,
      "flops": logged[-1]["flops_per_step"] * steps,
      "images_per_step": images / steps,
      "flops_per_step": logged[-1]["flops_per_step"],
      "padding": (statistics.mean(row["padding_fraction"] for row in logged)
                  if packed else None),
      "left_over": (statistics.mean(row["dropped_fraction"] for row in logged)
                    if packed else None),
      "accuracy": [row["test_accuracy"] for row in rows
                   if "test_accuracy" in row][-1],
      "img_per_sec": statistics.median(
          row["img_per_sec_per_device"] for row in logged[1:] or logged)}


def runs(variant, steps, seeds, per_sequence, dataset, data_dir):
  """summary() of a run of `variant` for each seed."""
  out = []
  for seed in seeds:
    rows, batch_size = train(variant, steps, seed, per_sequence, dataset,
                             data_dir)
    out.append(summary(rows, steps, batch_size))
  return out


def print_row(name, results, padding):
  first = results[0]
  accuracy = statistics.mean(r["accuracy"] for r in results)
  each = (" (" + ", ".join(f"{r['accuracy']:.3f}" for r in results) + ")"
          if len(results) > 1 else "")
  padding = first["padding"] if first["padding"] is not None else padding
  left_over = ("" if first["left_over"] is None else
               f"{statistics.mean(r['left_over'] for r in results):.1%}")
  img = statistics.median(r["img_per_sec"] for r in results)
  print(f"| {name} | {first['steps']} | "
        f"{statistics.mean(r['images'] for r in results):,.0f} | "
        f"{first['flops'] / 1e12:.2f} | {padding:.1%} | {left_over} | "
        f"{accuracy:.3f}{each} | {img:,.0f} |", flush=True)


def main(argv):
  del argv
  f = flags.FLAGS
  load = os.getloadavg()[0]  # Before this process loads the CPU.
  from vit_jax import runtime  # pylint: disable=g-import-not-at-top
  runtime.apply()
  runtime.use_compilation_cache()  # The packed runs' program, compiled once.
  long_sides = (f.min_long_side, f.max_long_side)
  seeds = [int(seed) for seed in f.seeds]
  per_sequence = f.images_per_sequence
  scratch = tempfile.TemporaryDirectory()
  folder = os.path.join(scratch.name, "digits")
  write_folder(folder, long_sides)
  data_dir = os.path.join(scratch.name, "data")
  print(f"The digits with the longer side {long_sides[0]}-{long_sides[1]} "
        f"px: {mean_patches(long_sides):.1f} patches of 2 x 2 on average at "
        f"their own size, in sequences of {BUDGET}; seeds {seeds}. "
        f"Load average before the first run: {load:.2f} on "
        f"{os.cpu_count()} cores"
        + (" (other work shared the CPU: the img/s are contended)"
           if load > 0.1 else "") + ".")
  print("| run | steps | images seen | TFLOPs | padding | left over | "
        "test accuracy | img/s per device |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  done = {}
  for variant in f.variants:
    done[variant] = runs(variant, f.steps, seeds, per_sequence,
                         f"folder:{folder}", data_dir)
    print_row(f"{variant}, {f.steps} steps", done[variant],
              naflex_padding(long_sides) if variant == "naflex" else 0.0)
  if not (f.compare and "naflex" in done and "packed" in done):
    return
  naflex, packed = done["naflex"][0], done["packed"][0]
  per_step = statistics.mean(r["images_per_step"] for r in done["packed"])
  for name, steps in (
      ("packed, NaFlex's images", round(naflex["images"] / per_step)),
      ("packed, NaFlex's FLOPs",
       round(naflex["flops"] / packed["flops_per_step"]))):
    print_row(name, runs("packed", steps, seeds, per_sequence,
                         f"folder:{folder}", data_dir), 0.0)


if __name__ == "__main__":
  app.run(main)
