"""python -m vit_jax.predict --workdir=DIR | --from=SOURCE --images=PATH,... [--labels=FILE]
python -m vit_jax.predict --from=FILE.stablehlo --images=PATH,...

The top classes of a trained model on your images, with probabilities.
Images (PNG, JPEG, GIF, BMP files, folders of them, or glob patterns; also
as positional arguments) are resized to the model's resolution as the run's
evaluation resized them. Class names come from --labels (one per line), else
from the TFDS label names of --dataset (default: the run's dataset), else
from the checkpoint (an HF model's id2label), else they are class numbers.
The model runs in float32 on one device. A .stablehlo source is a model
that vit_jax.export wrote: its own module runs, with its class names.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax import cli
from vit_jax.analysis import classify
from vit_jax.cli import shared_flags
from vit_jax.data import image_files
from vit_jax.weights import function_exports

shared_flags.define_model_source("run")
shared_flags.define_images()
flags.DEFINE_integer("top", 5, "How many classes to show per image.",
                     lower_bound=1)
flags.DEFINE_integer("batch_size", 64, "Images per forward pass.")
flags.DEFINE_bool("json", False, "One JSON object per image instead of "
                  "text.")


def main(argv):
  f = flags.FLAGS
  paths = f.images + argv[1:]
  if not paths:
    raise app.UsageError("no images: give --images=PATH,... or paths")
  files = image_files.expand(paths)
  source = shared_flags.source_from_flags()
  if source.endswith(function_exports.STABLEHLO_SUFFIX):
    probabilities, names = exported(source, files)
  else:
    probabilities, names = inferred(files)
  tops = classify.top_classes(probabilities, f.top, names)
  show = classify.as_json if f.json else classify.as_text
  for path, top in zip(files, tops):
    print(show(path, top))


def inferred(files):
  """(probabilities, class names) of the model of the source flags."""
  f = flags.FLAGS
  inference = shared_flags.model_from_flags()
  pixels = image_files.from_files(files, inference.image_size,
                                  inference.crop_fraction)
  names = (image_files.name_classes(
      f.labels, *inference.data(f.dataset, f.data_dir),
      num_classes=inference.model.num_classes) or inference.class_names)
  return classify.probabilities(inference, pixels, f.batch_size), names


def exported(source, files):
  """(probabilities, class names) of the StableHLO export `source`."""
  f = flags.FLAGS
  served = function_exports.load_stablehlo(source)
  pixels = image_files.from_files(files, served.image_size,
                                  served.crop_fraction)
  probabilities = served.probabilities(pixels, f.batch_size)
  names = image_files.name_classes(
      f.labels, f.dataset, f.data_dir or None,
      num_classes=probabilities.shape[-1]) or served.class_names
  return probabilities, names


if __name__ == "__main__":
  cli.run(main, positional=True)
