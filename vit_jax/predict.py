"""python -m vit_jax.predict --workdir=DIR | --from=SOURCE --images=PATH,... [--labels=FILE]
python -m vit_jax.predict --from=FILE.stablehlo --images=PATH,...
python -m vit_jax.predict --from=SOURCE --features [--json] IMAGES
python -m vit_jax.predict ... --max_num_patches=N IMAGES
python -m vit_jax.predict --workdir=DIR --class_names=cat,dog [--templates=...] IMAGES

The top classes of a trained model on your images, with probabilities.
Images (PNG, JPEG, GIF, BMP files, folders of them, or glob patterns; also
as positional arguments) are resized to the model's resolution as the run's
evaluation resized them. Class names come from --labels (one per line), else
from the TFDS label names of --dataset (default: the run's dataset), else
from the checkpoint (an HF model's id2label), else they are class numbers.
The model runs in float32 on one device. A .stablehlo source is a model
that vit_jax.export wrote: its own module runs, with its class names.
With --features, the pooled features that the head reads instead (its
pre_logits output; vit_jax/analysis/features.py), for any model, headless
ones included (a SigLIP tower, a DINOv2, a timm model saved without head).
With --max_num_patches=N, each image keeps its aspect ratio: it is resized
to the largest grid of at most N patches and read NaFlex-style, the
position embedding resized to its grid (vit_jax/models/naflex.py); with
--native_size too, it keeps its own size, shrunk only to fit, as a packed
run evaluates. A NaFlex or packed run of ours is read so without them, at
its config.naflex.max_num_patches, as its evaluation read its images;
each flag given overrides its part (--max_num_patches=0: square).
With --class_names, a two-tower source (an image_text run, transformers'
SiglipModel) classifies zero-shot: each class's captions (--templates
with its names, '|' between synonyms) through the text tower, averaged;
the probability shown is SigLIP's, sigmoid(t * cosine + b), each class's
on its own (docs/image_text.md).
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app, flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax import cli, errors, paths as paths_lib
from vit_jax.analysis import classify, features
from vit_jax.cli import shared_flags
from vit_jax.data import image_files
from vit_jax.models import naflex
from vit_jax.training.objectives import image_text
from vit_jax.weights import function_exports

shared_flags.define_model_source("run")
shared_flags.define_images()
flags.DEFINE_integer("top", 5, "How many classes to show per image.",
                     lower_bound=1)
flags.DEFINE_integer("batch_size", 64, "Images per forward pass.",
                     lower_bound=1)
flags.DEFINE_bool("json", False, "One JSON object per image instead of "
                  "text.")
shared_flags.define_zero_shot("classify images into")
flags.DEFINE_bool("features", False, "The features the head reads (the "
                  "pooled output, as a headless tower gives it) instead of "
                  "classes; --top and --labels are then unused.")


def main(argv):
  f = flags.FLAGS
  paths = f.images + argv[1:]
  if not paths:
    raise app.UsageError("no images: give --images=PATH,... or paths")
  for given, flag in ((paths, "--images"), (f.data_dir, "--data_dir")):
    paths_lib.check_reachable(given, flag)
  files = image_files.expand(paths)
  source = shared_flags.source_from_flags()
  exported_model = source.endswith(function_exports.STABLEHLO_SUFFIX)
  if exported_model and f.max_num_patches:
    raise errors.InputError(
        "--max_num_patches: an export takes square images at its "
        "resolution; give the model's checkpoint with --from instead")
  if f.class_names:
    probabilities = zero_shot(source, files)
    tops = classify.top_classes(probabilities, f.top, f.class_names)
    for path, top in zip(files, tops):
      print(classify.as_json(path, top) if f.json
            else classify.as_text(path, top))
    return
  if f.features:
    show = features.as_json if f.json else features.as_text
    rows, grids = features_of(source, files)
    for path, row, grid in zip(files, rows, grids):
      print(show(path, row, grid))
    return
  if exported_model:
    probabilities, names = exported(source, files)
    grids = [None] * len(files)
  else:
    probabilities, names, grids = inferred(files)
  tops = classify.top_classes(probabilities, f.top, names)
  for path, top, grid in zip(files, tops, grids):
    print(classify.as_json(path, top, grid) if f.json
          else classify.as_text(path, top))


def inferred(files):
  """(probabilities, class names, each image's NaFlex grid or None) of the
  model of the source flags."""
  f = flags.FLAGS
  inference = shared_flags.model_from_flags()
  inputs = model_inputs(files, inference)
  names = (image_files.name_classes(
      f.labels, *inference.data(f.dataset, f.data_dir),
      num_classes=inference.model.num_classes) or inference.class_names)
  return (classify.probabilities(inference, inputs, f.batch_size), names,
          grids_of(inputs, files))


def model_inputs(files, inference):
  """The images as the model sees them, as the run's evaluation read them
  unless --max_num_patches or --native_size say otherwise: square at its
  resolution, or each at its own aspect ratio (a NaFlex batch)."""
  budget = shared_flags.naflex_budget(inference)
  if budget:
    return image_files.naflex_from_files(files, budget)
  return image_files.from_files(files, inference.image_size,
                                inference.crop_fraction)


def features_of(source, files):
  """(float32 features [N, width] of `source`'s model on the images, each
  image's NaFlex grid or None)."""
  f = flags.FLAGS
  if source.endswith(function_exports.STABLEHLO_SUFFIX):
    served = function_exports.load_stablehlo(source)
    pixels = image_files.from_files(files, served.image_size,
                                    served.crop_fraction)
    return features.of_export(served, pixels, f.batch_size), [None] * len(
        files)
  inference = shared_flags.model_from_flags(features=True)
  inputs = model_inputs(files, inference)
  return (features.features(inference, inputs, f.batch_size),
          grids_of(inputs, files))


def zero_shot(source, files):
  """SigLIP's probability of each class of --class_names for each image,
  [N, classes], by the two towers of `source`."""
  f = flags.FLAGS
  classifier = image_text.ZeroShotClassifier(source, f.class_names,
                                             f.templates, f.tokenizer)
  logits = classifier.logits(image_files.from_files(files,
                                                    classifier.image_size))
  return 1 / (1 + np.exp(-logits))


def grids_of(inputs, files):
  """Each image's grid ([rows, cols] of patches) where `inputs` are a
  NaFlex batch, else None for each of `files`."""
  if isinstance(inputs, naflex.Patches):
    return inputs.grid
  return [None] * len(files)


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
