"""Images for a trained model to look at: files, or a split of a dataset,
resized exactly as evaluation resizes them (`preprocess.eval_resize`).

Both give uint8 [N, size, size, 3], what the model takes; or, at a NaFlex
budget, each image at its own aspect ratio as patches
(`naflex_from_files`). Files, folders
and labels files may be local or URLs (`gs://...`), read through epath.
"""

import glob

import numpy as np

from vit_jax import errors, paths as paths_lib
from vit_jax.data import pipeline, preprocess, sources, vtab_tasks
from vit_jax.data.lazy_tensorflow import tf
from vit_jax.models import naflex

EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def expand(paths):
  """Image files named by `paths`: files, folders (their image files, sorted)
  or glob patterns. Raises an InputError naming what matched nothing."""
  files = []
  for path in paths:
    given = paths_lib.path(path)
    if given.is_dir():
      found = sorted(paths_lib.join(path, child.name)
                     for child in given.iterdir()
                     if child.name.lower().endswith(EXTENSIONS))
    elif given.is_file():
      found = [path]
    elif paths_lib.is_url(path):
      found = sorted(tf.io.gfile.glob(path))
    else:  # Locally Python's glob, with its rules (hidden files, `**`).
      found = sorted(glob.glob(path))
    if not found:
      raise errors.InputError(
          f"no image at {path!r} (a file, a folder of "
          f"{'/'.join(EXTENSIONS)} files, or a glob pattern)")
    files.extend(found)
  return files


def from_files(files, image_size, crop_fraction=1.0):
  """The images in `files` (PNG, JPEG, GIF or BMP), as evaluation sees them."""
  return np.stack([
      preprocess.eval_resize(_decoded(path), image_size, crop_fraction).numpy()
      for path in files])


def naflex_from_files(files, budget):
  """The images in `files` at their own aspect ratio, as a NaFlex batch
  (models/naflex.py) of numpy arrays: each resized to its grid under
  `budget` (a naflex.Budget; preprocess.naflex_patches)."""
  pixels, grids = zip(*(
      (x.numpy() for x in preprocess.naflex_patches(_decoded(path), *budget))
      for path in files))
  return naflex.Patches(np.stack(pixels), np.stack(grids))


def _decoded(path):
  encoded = paths_lib.path(path).read_bytes()
  try:
    return preprocess.decode(encoded)
  except tf.errors.InvalidArgumentError:
    raise errors.InputError(f"{path} is not an image that TensorFlow decodes "
                            "(PNG, JPEG, GIF, BMP)") from None


def from_dataset(dataset, split, count, image_size, crop_fraction=1.0,
                 data_dir=None, budget=None):
  """(the first `count` images of `split`, their labels), as the evaluators
  read them: square, or with a NaFlex `budget` (models/naflex.py) a
  NaFlex batch."""
  source = sources.lookup(dataset, data_dir)
  count = min(count, source.num_examples(split))
  batch = next(pipeline.eval_dataset(
      source, split, batch_size=count, image_size=image_size,
      eval_crop_fraction=crop_fraction, naflex=budget).as_numpy_iterator())
  return naflex.inputs_of(batch), batch["label"]


def class_names(dataset, data_dir=None):
  """The names of `dataset`'s classes, or None where it gives none (a VTAB
  task's derived labels, a dataset not prepared here)."""
  if dataset.startswith(sources.VTAB_PREFIX):
    task = vtab_tasks.get(dataset[len(sources.VTAB_PREFIX):])
    if task.label is not None:
      return None
    dataset = task.tfds_name
  try:
    builder = sources.get_builder(dataset, data_dir)
  except errors.InputError:
    return None
  key = sources.LABEL_FEATURES.get(builder.name, "label")
  return list(builder.info.features[key].names)


def name_classes(labels_file="", dataset="", data_dir=None,
                 num_classes=None):
  """Class names from `labels_file` (a text file, one name per line) if
  given, else from `dataset`, else None. A file with fewer names than the
  model's `num_classes` is refused: names would be given to other classes."""
  if labels_file:
    file = paths_lib.path(labels_file)
    if not file.is_file():
      raise errors.InputError(f"labels file {labels_file} does not exist "
                              "(a text file, one class name per line)")
    names = [line.strip() for line in file.read_text().splitlines()
             if line.strip()]
    if num_classes is not None and len(names) != num_classes:
      raise errors.InputError(
          f"labels file {labels_file} has {len(names)} names for the "
          f"model's {num_classes} classes: one name per line, in class "
          "order")
    return names
  return class_names(dataset, data_dir) if dataset else None
