"""The datasets a run reads: looked up, prepared where we can, described.

A dataset is a TFDS name, one shipped with vit_jax ("digits"),
"folder:PATH", a folder of images laid out by class (vit_jax/data/folder.py),
"captions:PATH", a folder of captioned images (vit_jax/data/captioned.py),
or "vtab:TASK", a VTAB-1k task (a TFDS dataset and the label the task reads
from it, vit_jax/data/vtab_tasks.py). Shipped datasets and folders are
prepared into `data_dir` on first use; nothing is ever downloaded.

`lookup` finds one dataset's `Source`; a run keeps a `Sources`, which looks
each dataset up once (a folder is walked and hashed once per run, not at
every evaluation).

`data_dir` may be a URL (`gs://BUCKET/tensorflow_datasets`): TFDS reads
prepared datasets there, streamed from TFRecord files. Shipped and folder
datasets are not prepared into one: they are prepared as ArrayRecord, which
is written and read on local paths only.
"""

import contextlib
import dataclasses
import io
import os
from typing import Callable

import jax
import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from vit_jax import errors, paths
from vit_jax.data import (
  broken_records,
  captioned,
  digits,
  folder,
  vtab_tasks,
)
from vit_jax.data.lazy_tensorflow import tf

# Builders of ours, prepared on first use instead of by `tfds build`; not
# registered with TFDS, so importing vit_jax adds nothing to its catalog.
# "digits/0to4" names one of a builder's configs.
SHIPPED_DATASETS = {"digits": digits.Digits}


# "folder:PATH": the images under PATH, prepared on first use (datasets/folder).
FOLDER_PREFIX = folder.PREFIX


VTAB_PREFIX = "vtab:"
# "captions:PATH": a folder's captioned images (data/captioned.py).
CAPTIONS_PREFIX = captioned.PREFIX
# A dataset's texts, for image-text training: a sequence of texts (a
# captioned folder's, coco_captions-like) or one.
CAPTION_FEATURES = ("captions", "caption")


# What shipped and folder datasets are prepared as: read at random, each
# epoch a permutation of the whole split (data/random_access.py).
PREPARED_FORMAT = "array_record"


# Datasets whose class label is not the feature "label": ImageNet ReaL's
# validation images carry the original ImageNet label beside the ReaL sets.
LABEL_FEATURES = {"imagenet2012_real": "original_label"}
# Without a "label", a "labels" feature that is a set of classes (a TFDS
# Sequence of ClassLabel, as in voc or bigearthnet) makes a dataset
# multi-label: each example's label is a multi-hot row of its classes.
MULTI_LABEL_FEATURE = "labels"


def get_builder(dataset: str, data_dir: str | None,
                file_format: str = PREPARED_FORMAT, folder_config=None):
  """The prepared TFDS builder of `dataset`; never downloads anything.

  `dataset` is a TFDS name ("cifar10", "imagenet2012:5.1.0", ...), one of
  SHIPPED_DATASETS, or "folder:PATH"; the last two are prepared into
  `data_dir` the first time (a folder again whenever its files change), in
  `file_format`. Other datasets must have been prepared in `data_dir` (None
  or "", as configs leave it: TFDS's default) beforehand. A prepared
  dataset is read in the format it was written in. `folder_config`: the
  folder's folder.make_config, when it has been scanned already.
  """
  data_dir = data_dir or None
  if dataset.startswith(FOLDER_PREFIX):
    config = folder_config or folder.make_config(dataset[len(FOLDER_PREFIX):])
    return _folder_builder(config, data_dir, file_format)
  if dataset.startswith(CAPTIONS_PREFIX):
    return _folder_builder(
        captioned.make_config(dataset[len(CAPTIONS_PREFIX):]), data_dir,
        file_format, captioned.Captioned)
  builder = _builder(dataset, data_dir)
  if builder.is_prepared():
    return builder
  if builder.name not in SHIPPED_DATASETS:
    raise errors.InputError(
        f"dataset {dataset!r} is not prepared in {builder.data_dir}: TFDS "
        f"datasets must be prepared beforehand (`tfds build {builder.name} "
        f"--data_dir=DIR`, after any manual download its documentation asks "
        f"for) and data_dir set to DIR; vit_jax does not download data")
  _prepare_here(_builder(dataset, data_dir, file_format))
  # A fresh builder reads the info of the files on disk, whoever wrote them.
  return _builder(dataset, data_dir)


def _folder_builder(config, data_dir, file_format, kind=folder.Folder):
  # Named by a fingerprint of the folder's files: a changed folder is a new
  # config, prepared afresh, and never the stale copy of an earlier one.
  builder = kind(config=config, data_dir=data_dir)
  if builder.is_prepared():
    return builder
  _prepare_here(kind(config=config, data_dir=data_dir,
                     file_format=file_format))
  builder = kind(config=config, data_dir=data_dir)
  broken = folder.broken_files(builder)
  if broken and jax.process_index() == 0:
    print(describe_broken(broken, builder), flush=True)
  return builder


def describe_broken(broken, builder, shown=3):
  """What a folder's preparation left out, in a few lines."""
  total = sum(split.num_examples for split in builder.info.splits.values())
  lines = [
      f"Left out {len(broken)} of {total + len(broken)} files of "
      f"{builder.builder_config.root} that do not decode as images "
      f"(all listed in {paths.join(builder.data_dir, folder.BROKEN_FILES)}):"
  ]
  lines += [f"  {relative}: {reason}" for relative, reason in broken[:shown]]
  if len(broken) > shown:
    lines.append(f"  ... and {len(broken) - shown} more")
  return "\n".join(lines)


def check_broken_images(source, policy):
  """Refuses a folder dataset that left images out, where `policy`
  (config.broken_images) is "refuse"; "skip" trains on the rest."""
  broken_records.check_policy(policy)
  if policy == "skip" or not source.name.startswith(FOLDER_PREFIX):
    return
  builder = source.builder
  broken = folder.broken_files(builder)
  if broken:
    raise errors.InputError(
        f"{len(broken)} files of {builder.builder_config.root} do not decode "
        f"as images, and config.broken_images is 'refuse': first "
        f"{broken[0][0]} ({broken[0][1]}); all listed in "
        f"{paths.join(builder.data_dir, folder.BROKEN_FILES)}")


def _builder(dataset, data_dir, file_format=None):
  name, _, config = dataset.partition("/")
  if name in SHIPPED_DATASETS:
    # A format only to write in: one given for reading must match the
    # files'.
    return SHIPPED_DATASETS[name](config=config or None, data_dir=data_dir,
                                  file_format=file_format)
  try:
    return tfds.builder(dataset, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    # TFDS's own message lists every dataset it knows, burying the point.
    where = data_dir or ("TFDS's default data_dir ($TFDS_DATA_DIR or "
                         "~/tensorflow_datasets)")
    raise errors.InputError(
        f"unknown dataset {dataset!r}: it is not a TFDS dataset nor one "
        f"shipped with vit_jax ({', '.join(SHIPPED_DATASETS)}), nor a folder "
        f"of images ({FOLDER_PREFIX}PATH), and {where} holds no prepared "
        f"copy of it. A dataset outside the TFDS catalog (JFT-300M, "
        f"ImageNet-21k) is read from its TFDS files: put them in "
        f"DATA_DIR/{dataset.split(':')[0]}/VERSION/ (dataset_info.json, "
        f"features.json and the record files, with features 'image' and a "
        f"ClassLabel 'label', as `tfds build` of your own builder writes "
        f"them) and set config.data_dir=DATA_DIR") from None


def _prepare_here(builder):
  """Generates a shipped or folder dataset; another process may do it first.

  The processes of a local multi-process run all prepare at once; TFDS
  generates into a private directory and renames it into place, so every
  process but the first fails on the rename and finds the data there.
  ArrayRecord is not prepared into a URL (`gs://`): the array_record library
  writes and reads local files only, so such a copy could not be read.
  """
  if (paths.is_url(builder.data_dir_root) and
      builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD):
    raise errors.InputError(
        f"data_dir {builder.data_dir_root}: {builder.name} is prepared on "
        f"first use as ArrayRecord, which is written and read on local paths "
        f"only: set config.data_dir to a local folder, or to a gcsfuse "
        f"mount of the bucket")
  offline = tfds.download.DownloadConfig(try_download_gcs=False)
  if jax.process_index() == 0:
    print(f"Preparing dataset {builder.name} in {builder.data_dir} (once)",
          flush=True)
  try:
    with _quiet_unless_verbose():
      builder.download_and_prepare(download_config=offline)
  except Exception as e:  # pylint: disable=broad-except
    if builder.is_prepared():  # By another process, first.
      return
    cause = paths.storage_failure(e)
    if cause is None:
      raise
    # TFDS has removed its partial copy; the folders it made for it go too.
    _remove_empty_folders(builder.data_dir, builder.data_dir_root)
    raise errors.InputError(
        f"could not prepare {builder.name} in {builder.data_dir}: {cause}"
        f"{_room(builder)}. Nothing of it was kept: free space, or set "
        "config.data_dir to a disk with room, and run the same command "
        "again") from e


def _room(builder):
  """' (its images take N MB, ...; M MB are free)' for a local data_dir,
  as far as it is known."""
  parts = []
  files = getattr(builder.builder_config, "files", ())
  if files:
    images = sum(size for _, size, _ in files)
    parts.append(f"its images take {paths.describe_bytes(images)}, which "
                 "the copy needs and a little more")
  if not paths.is_url(builder.data_dir_root):
    free = paths.free_bytes(builder.data_dir_root)
    parts.append(f"{paths.describe_bytes(free)} are free")
  return f" ({'; '.join(parts)})" if parts else ""


def _remove_empty_folders(path, root):
  """Removes `path` and its parents up to `root` (excluded) while empty
  (local paths; a bucket has no empty folders)."""
  if paths.is_url(path):
    return
  path, root = os.path.abspath(path), os.path.abspath(root)
  while path.startswith(root + os.sep):
    try:
      os.rmdir(path)
    except OSError:  # Not empty, or gone.
      if os.path.exists(path):
        return
    path = os.path.dirname(path)


def _quiet_unless_verbose():
  """Hides TFDS's own report and progress bars of a preparation, unless the
  log is at INFO (`--verbose`)."""
  if logging.level_info():
    return contextlib.nullcontext()
  sink = io.StringIO()
  stack = contextlib.ExitStack()
  stack.enter_context(contextlib.redirect_stdout(sink))
  stack.enter_context(contextlib.redirect_stderr(sink))
  return stack


@dataclasses.dataclass(frozen=True)
class Source:
  """A prepared dataset, and how an example's image and class are read."""
  name: str  # as the config names it: "digits", "folder:PATH", "vtab:dtd"
  builder: tfds.core.DatasetBuilder
  num_classes: int
  # TFDS example (image still encoded) -> int32 class, or for a
  # multi-label dataset a float32 multi-hot row [num_classes].
  label: Callable
  image_key: str = "image"
  fix_image: Callable | None = None  # encoded image -> encoded image
  multi_label: bool = False
  # TFDS example -> tf.string [texts]: its captions, where it has any
  # (CAPTION_FEATURES); a dataset of captions alone has no classes
  # (num_classes 0, label None).
  captions: Callable | None = None

  def num_examples(self, split: str) -> int:
    """Examples in `split`, which may be a slice such as "train[:90%]"; an
    InputError for one that holds none (it could train or score nothing)."""
    try:
      count = self.builder.info.splits[split].num_examples
    except (KeyError, ValueError) as e:
      hint = ""
      if self.name.startswith(FOLDER_PREFIX):
        hint = (f" A folder's splits are its split folders (root/<split>/"
                f"<class>/<image>), or a single {folder.SINGLE_SPLIT!r} "
                f"split when the class folders are directly in it "
                f"(root/<class>/<image>); slice that, e.g. train_split "
                f"'{folder.SINGLE_SPLIT}[:90%]' and evaluators.test.split "
                f"'{folder.SINGLE_SPLIT}[90%:]'.")
      raise errors.InputError(f"dataset {self.name!r}: {e}{hint}") from None
    if count < 1:
      raise errors.InputError(
          f"dataset {self.name!r}: split {split!r} holds no examples: give "
          "a split that holds some")
    return count


def lookup(dataset: str, data_dir: str | None, folder_config=None) -> Source:
  """The Source of `dataset` (see the module docstring for the names),
  prepared if it is one we can prepare (`folder_config`: get_builder's)."""
  if dataset.startswith(VTAB_PREFIX):
    task = vtab_tasks.get(dataset[len(VTAB_PREFIX):])
    builder = get_builder(task.tfds_name, data_dir)
    label = task.label or _feature("label")
    return Source(dataset, builder, task.num_classes, label, task.image_key,
                  task.image)
  builder = get_builder(dataset, data_dir, folder_config=folder_config)
  features = builder.info.features
  key = LABEL_FEATURES.get(builder.name, "label")
  texts = _captions(features)
  if texts and key not in features:
    return Source(dataset, builder, 0, None, captions=texts)
  if key not in features and MULTI_LABEL_FEATURE in features and (
      _is_class_set(features[MULTI_LABEL_FEATURE])):
    num_classes = features[MULTI_LABEL_FEATURE].feature.num_classes
    return Source(dataset, builder, num_classes,
                  _multi_hot(MULTI_LABEL_FEATURE, num_classes),
                  multi_label=True)
  if key not in features:
    raise errors.InputError(
        f"dataset {dataset!r} has no {key!r} feature (nor a "
        f"{MULTI_LABEL_FEATURE!r} set of classes) to train on; its features "
        f"are {sorted(features.keys())}")
  return Source(dataset, builder, features[key].num_classes, _feature(key),
                captions=texts)


def _captions(features):
  """TFDS example -> tf.string [texts] of a dataset's caption feature, or
  None where it has none."""
  for key in CAPTION_FEATURES:
    if key not in features:
      continue
    feature = features[key]
    if not isinstance(feature, tfds.features.Sequence):
      return lambda example, key=key: tf.reshape(example[key], [1])
    if isinstance(feature.feature, tfds.features.FeaturesDict):
      # coco_captions': a sequence of {"id", "text"}.
      return lambda example, key=key: example[key]["text"]
    return lambda example, key=key: example[key]
  return None


def captions_in(source, split):
  """[[caption, ...], ...]: each record's captions, by its place in
  `split` (what evaluation's "index" says), its image not decoded."""
  features = source.builder.info.features
  feature = next(key for key in CAPTION_FEATURES if key in features)
  skip = {source.image_key: tfds.decode.SkipDecoding()}
  if source.builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD:
    records = source.builder.as_data_source(split=split, decoders=skip)
    rows = (records[i] for i in range(len(records)))
  else:
    rows = tfds.as_numpy(source.builder.as_dataset(split=split,
                                                   decoders=skip))
  def texts(value):
    return value["text"] if isinstance(value, dict) else value

  return [[text.decode("utf-8") for text in np.atleast_1d(texts(
      row[feature]))] for row in rows]


def _feature(key):
  return lambda example: tf.cast(example[key], tf.int32)


def _is_class_set(feature):
  return isinstance(feature, tfds.features.Sequence) and isinstance(
      feature.feature, tfds.features.ClassLabel)


def _multi_hot(key, num_classes):
  def label(example):
    # Summed and capped rather than maxed: an example with no class sums to
    # a row of zeros, where a max over nothing would be -inf.
    classes = tf.one_hot(example[key], num_classes, dtype=tf.float32)
    return tf.minimum(tf.reduce_sum(classes, axis=0), 1.0)
  return label


class Sources:
  """The datasets of one run under one data_dir, each looked up once:
  `sources(dataset)` is its Source ("" is the run's own dataset)."""

  def __init__(self, dataset: str, data_dir: str | None):
    self.dataset, self.data_dir = dataset, data_dir
    self._found = {}
    self._scanned = {}

  def __call__(self, dataset: str = "") -> Source:
    dataset = dataset or self.dataset
    if dataset not in self._found:
      self._found[dataset] = lookup(dataset, self.data_dir,
                                    self.folder_config(dataset))
    return self._found[dataset]

  def folder_config(self, dataset: str = ""):
    """The folder.FolderConfig of a folder dataset as it is now, scanned
    once (before anything is prepared); None for any other dataset."""
    dataset = dataset or self.dataset
    if not dataset.startswith(FOLDER_PREFIX):
      return None
    if dataset not in self._scanned:
      self._scanned[dataset] = folder.make_config(
          dataset[len(FOLDER_PREFIX):])
    return self._scanned[dataset]

  def folder_changes(self, contents: str):
    """folder.changed_files between the run's folder now and the copy of
    it named `contents` in data_dir (None: that copy is gone)."""
    return folder.changed_files(
        folder.Folder(config=self.folder_config(), data_dir=self.data_dir
                      or None), contents)
