"""A folder of images as a TFDS dataset: `dataset = "folder:/path/to/root"`.

Two layouts are recognised:

  root/<split>/<class>/<image>   e.g. root/train/cat/1.jpg, root/test/dog/7.png:
                                 one split per split folder (a folder whose
                                 children are all folders of images);
  root/<class>/<image>           a single split, "train"; slice it for a test
                                 set, e.g. "train[:90%]" and "train[90%:]".

Class names are the sorted names (Python string order: "B" before "a") of
the class folders, across all splits: a class missing from one split keeps its
label id there. Label ids follow that
order and the `ClassLabel` feature carries the names
(`info.features["label"].names`).

Images are the files ending in .png, .jpg or .jpeg (any case), of any size
and kind that TensorFlow's decoder reads as the pipeline will (it also reads
GIF, BMP and WebP content under those names): grayscale, RGB, RGBA, gray
with alpha, palette, 16-bit (scaled to 8 bits) and CMYK JPEGs all become
RGB uint8, alpha dropped (`vit_jax.preprocess.decode`). EXIF orientation is
not applied: a photo is used as its pixels are stored, as TFDS's own image
decoding does. Files are stored in the prepared copy as they are, byte for
byte: TFDS's `Image` feature keeps encoded bytes it is given without
re-encoding.

Every file is decoded once when the folder is prepared. One that does not
decode (not an image, truncated, empty) is left out, and the preparation
lists each such file with TensorFlow's reason in `broken_files.txt` next to
the prepared copy (`broken_files`); the run trains on the rest, unless
config.broken_images is "refuse". Other files (.txt, .gif, ...) and names
starting with "." (hidden files, macOS "._x.jpg" resource forks,
.ipynb_checkpoints) are ignored. Images lie directly in their class folder:
a class folder with no images, or with sub-folders, is an error naming it.

The folder is prepared, like the shipped datasets, into `data_dir` on first
use: `data_dir/folder/<config>/1.1.0`, where the config's name is the folder's
base name and a hash of its absolute path and of the sorted (relative path,
size, mtime) of its images. Adding, removing or replacing an image therefore
makes a new config, prepared afresh, rather than reading a stale copy; the
copies of earlier contents stay in `data_dir` until deleted; each lists
the files it was made of in FILES, so that a run resumed on a changed folder
is told which changed (`changed_files`; vit_jax/training/resolve.py
refuses it). The folder is scanned (one `stat` per entry) each time the
dataset is opened. A file name that is not UTF-8 is read as its bytes; a
folder's must be UTF-8, since it names a class. PATH may be a local
directory (the same on every host of a pod) or a URL
(`folder:gs://BUCKET/images`), listed and read through tf.io.gfile; a URL
is used as given, a local path made absolute.
"""

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import stat as stat_lib

import tensorflow_datasets as tfds
from etils import epath

from vit_jax import errors, paths
from vit_jax.data.lazy_tensorflow import tf

PREFIX = "folder:"
SINGLE_SPLIT = "train"  # The split of the root/<class>/<image> layout.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
# Next to the prepared copy: "relative path<TAB>reason" per file left out.
BROKEN_FILES = "broken_files.txt"
# And "relative path<TAB>size<TAB>mtime_ns" per image found: what a run
# that trained on the copy compares the folder with (`changed_files`).
FILES = "files.tsv"
_SPLIT_NAME = re.compile(r"[\w-]+")  # What TFDS accepts in split names.
_LAYOUTS = ("root/<class>/<image> or root/<split>/<class>/<image>, images "
            "being .png, .jpg or .jpeg files")
HASH_LENGTH = 12  # Hex digits of the fingerprint in the config name.


@dataclasses.dataclass(eq=False)
class FolderConfig(tfds.core.BuilderConfig):
  """A folder's contents when scanned; the name is their fingerprint.

  splits: ((split, ((relative path, label id), ...)), ...), sorted.
  files: ((relative path, size, mtime_ns), ...), sorted.
  """
  root: str = ""
  classes: tuple[str, ...] = dataclasses.field(default=(), repr=False)
  splits: tuple = dataclasses.field(default=(), repr=False)
  files: tuple = dataclasses.field(default=(), repr=False)


# Entries of a folder in a bucket are looked at this many at a time: each
# is a request.
_URL_STATS_AT_ONCE = 32


def _stat(path):
  """(is a folder, size, mtime_ns) of the entry at `path`; None where it
  is gone (deleted since listed, a broken link)."""
  if paths.is_url(path):
    try:
      found = tf.io.gfile.stat(path)
    except tf.errors.NotFoundError:
      return None
    return found.is_directory, found.length, found.mtime_nsec
  # os.stat on a local path: gfile and epath round its mtime to seconds,
  # which would miss an image replaced within the second.
  try:
    found = os.stat(path)
  except FileNotFoundError:
    return None
  return stat_lib.S_ISDIR(found.st_mode), found.st_size, found.st_mtime_ns


def _listdir(path):
  """The names in the folder at `path`. Locally, os.listdir's: a name that
  is not UTF-8 keeps its bytes as surrogates, where tf.io.gfile's fails on
  it. (An object name in a bucket is UTF-8.)"""
  return tf.io.gfile.listdir(path) if paths.is_url(path) else os.listdir(path)


def _not_utf8(name):
  """True for a local name that is not UTF-8 (held with surrogates)."""
  try:
    name.encode("utf-8")
  except UnicodeEncodeError:
    return True
  return False


def _printable(name):
  """`name` with the bytes that are not UTF-8 written as \\xNN."""
  return name.encode("utf-8", "surrogateescape").decode("utf-8",
                                                        "backslashreplace")


def _entries(path):
  """(sub-folder names, [(image name, size, mtime_ns)]) of path, sorted."""
  url = paths.is_url(path)
  folders, others = set(), set()
  for name in _listdir(path):
    if name.startswith("."):
      continue
    if name.endswith("/"):  # A bucket's sub-folder, as tf.io.gfile names it.
      folders.add(name.rstrip("/"))
    elif not url or _is_image_name(name):
      # In a bucket a name without "/" is an object: a file. Locally any
      # name may be a folder.
      others.add(name)
  names = sorted(others)
  children = [paths.join(path, name) for name in names]
  if url and len(children) > 1:  # A request each: many at a time.
    with concurrent.futures.ThreadPoolExecutor(_URL_STATS_AT_ONCE) as pool:
      stats = list(pool.map(_stat, children))
  else:
    stats = [_stat(child) for child in children]
  images = []
  for name, found in zip(names, stats):
    if found is None:
      continue
    is_folder, size, mtime_ns = found
    if is_folder:
      folders.add(name)
    elif _is_image_name(name):
      images.append((name, size, mtime_ns))
  return sorted(folders), images


def _is_image_name(name):
  return any(name.lower().endswith(extension)
             for extension in IMAGE_EXTENSIONS)


def _class_images(root, relative):
  """[(relative path, size, mtime_ns)] of a class folder; at least one."""
  path = paths.join(root, relative)
  folders, images = _entries(path)
  if folders:
    raise errors.InputError(
        f"class folder {path} holds sub-folders ({', '.join(folders[:3])}): "
        f"images must lie directly in their class folder; expected "
        f"{_LAYOUTS}")
  if not images:
    raise errors.InputError(
        f"class folder {path} holds no images (.png, .jpg or "
        f".jpeg files)")
  return [(f"{relative}/{name}", size, mtime_ns)
          for name, size, mtime_ns in images]


def scan(root):
  """{split: {class: [(relative path, size, mtime_ns)]}} of root's images.

  Raises an InputError, naming the path, for a folder that is not one of the
  two layouts, or where a class folder holds no images.
  """
  if not tf.io.gfile.isdir(root):
    raise errors.InputError(f"folder dataset {root}: not a directory; expected "
                            f"{_LAYOUTS}")
  folders, images = _entries(root)
  if images:
    raise errors.InputError(
        f"folder dataset {root} holds images directly ("
        f"{', '.join(name for name, _, _ in images[:3])}): put each image in "
        f"the folder of its class; expected {_LAYOUTS}")
  if not folders:
    what = ("is empty" if not _listdir(root)
            else "holds no folders of images")
    raise errors.InputError(
        f"folder dataset {root} {what}: expected {_LAYOUTS}")
  for name in folders:
    if _not_utf8(name):
      # A class folder's name is a label's name, which TFDS stores as text.
      raise errors.InputError(
          f"folder dataset {_printable(root)}: the name of folder "
          f"'{_printable(name)}' is not UTF-8: rename it")
  children = {name: _entries(paths.join(root, name)) for name in folders}
  for name, (sub_folders, sub_images) in children.items():
    path = paths.join(root, name)
    if sub_folders and sub_images:
      raise errors.InputError(
          f"{path} holds both images and folders: a class folder holds only "
          f"images, a split folder only class folders; expected {_LAYOUTS}")
    if not sub_folders and not sub_images:
      raise errors.InputError(
          f"{path} holds no images (.png, .jpg or .jpeg files) nor class "
          f"folders: a class folder needs at least one image, a split folder "
          f"at least one class folder; expected {_LAYOUTS}")
  split_folders = [name for name in folders if children[name][0]]
  class_folders = [name for name in folders if children[name][1]]
  if split_folders and class_folders:
    raise errors.InputError(
        f"folder dataset {root} mixes split folders, which hold class folders "
        f"({', '.join(split_folders[:3])}), and class folders, which hold "
        f"images ({', '.join(class_folders[:3])}): expected {_LAYOUTS}")
  if class_folders:  # Listed and checked above.
    return {SINGLE_SPLIT: {
        name: [(f"{name}/{image}", size, mtime_ns)
               for image, size, mtime_ns in children[name][1]]
        for name in class_folders}}
  splits = {}
  for split in split_folders:
    if not _SPLIT_NAME.fullmatch(split) or split.lower() == "all":
      raise errors.InputError(
          f"split folder {paths.join(root, split)}: TFDS split names are "
          f"letters, digits, '_' and '-', and not 'all'")
    for name in children[split][0]:
      if _not_utf8(name):
        raise errors.InputError(
            f"folder dataset {_printable(root)}: the name of folder "
            f"'{split}/{_printable(name)}' is not UTF-8: rename it")
    splits[split] = {
        name: _class_images(root, f"{split}/{name}")
        for name in children[split][0]
    }
  return splits


def make_config(root):
  """Scans the folder at root into a FolderConfig named by its contents."""
  if not root:
    raise errors.InputError(
        f"dataset {PREFIX!r} names no folder: use {PREFIX}PATH")
  # A URL as given (without a trailing "/"); a local path made absolute,
  # as the fingerprint of where the images are.
  root = (os.fspath(paths.path(root)) if paths.is_url(root)
          else paths.shown(paths.path(root).expanduser()))
  found = scan(root)
  classes = sorted({name for by_class in found.values() for name in by_class})
  label = {name: index for index, name in enumerate(classes)}
  splits, fingerprint = [], []
  for split in sorted(found):
    examples = []
    for name, images in sorted(found[split].items()):
      for relative, size, mtime_ns in images:
        examples.append((relative, label[name]))
        fingerprint.append((relative, size, mtime_ns))
    splits.append((split, tuple(examples)))
  digest = hashlib.sha256(
      json.dumps([root, sorted(fingerprint)]).encode()).hexdigest()
  base = re.sub(r"[^\w-]+", "_", paths.path(root).name).strip("_")[:40]
  name = f"{base}-{digest[:HASH_LENGTH]}" if base else digest[:HASH_LENGTH]
  return FolderConfig(
      name=name, root=root, classes=tuple(classes), splits=tuple(splits),
      files=tuple(sorted(fingerprint)),
      description=f"The images under {root}, one class per folder.")


class Folder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """The images of a folder, by class; construct with config=make_config()."""

  name = "folder"
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {
      "1.1.0": "Files that do not decode are left out and listed in "
               f"{BROKEN_FILES}.",
      "1.0.0": "PNG/JPEG files stored as they are, labelled by the sorted "
               "names of their class folders.",
  }

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    # As in digits.py: TFDS's default needs `importlib_resources`.
    return epath.Path(__file__)

  def _create_builder_config(self, builder_config, version):
    # Every FolderConfig is custom, named by the folder's contents; TFDS
    # would log a warning each time one is opened.
    if isinstance(builder_config, FolderConfig):
      return builder_config
    raise ValueError("a Folder dataset needs config=folder.make_config(PATH)")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.builder_config.description,
        features=tfds.features.FeaturesDict({
            # Encoded bytes are stored unchanged; decoding gives RGB.
            "image": tfds.features.Image(shape=(None, None, 3)),
            "label": tfds.features.ClassLabel(
                names=list(self.builder_config.classes)),
        }),
        supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the images are on disk.
    return {split: self._generate_examples(examples)
            for split, examples in self.builder_config.splits}

  def _download_and_prepare(self, dl_manager, download_config):
    self._broken = []
    super()._download_and_prepare(dl_manager, download_config)
    # Into the directory that TFDS renames into place when it is done
    # (local or a URL): no reader sees it before it is whole.
    write_lines(paths.join(self.data_dir, BROKEN_FILES),
                 [(relative, reason) for relative, reason in
                  sorted(self._broken)])
    write_lines(paths.join(self.data_dir, FILES), self.builder_config.files)

  def _generate_examples(self, examples):
    for relative, label in examples:
      encoded = paths.path(paths.join(self.builder_config.root,
                                      relative)).read_bytes()
      reason = undecodable(encoded)
      if reason:
        self._broken.append((relative, reason))
        continue
      # The path relative to the root is a stable, unique key; as its bytes,
      # which TFDS hashes as they are (a file name need not be UTF-8, which
      # TFDS would encode a str key to).
      yield relative.encode("utf-8", "surrogateescape"), {
          "image": encoded, "label": label}


def undecodable(encoded):
  """Why the input pipeline could not decode `encoded`, or None if it can."""
  if not encoded:
    return "empty file"
  try:
    if tf.io.is_jpeg(encoded):
      # Training decodes a JPEG and crops it at once; the whole image as the
      # window decodes all of it, as evaluation does.
      height, width, _ = tf.io.extract_jpeg_shape(encoded).numpy()
      tf.io.decode_and_crop_jpeg(encoded, [0, 0, height, width], channels=3)
    else:
      tf.io.decode_image(encoded, channels=3, expand_animations=False)
  except tf.errors.OpError as e:
    # "{{function_node ...}} Invalid PNG. ... [Op:DecodeImage]" -> the middle.
    message = re.sub(r"\{\{.*?\}\}|\[Op:\w+\]", "", e.message)
    return " ".join(message.split()) or type(e).__name__
  return None


def broken_files(builder):
  """[(relative path, reason)] of the files that preparing `builder` (a
  prepared Folder) left out."""
  return [tuple(row) for row in
          _read_lines(paths.join(builder.data_dir, BROKEN_FILES), 2)]


def changed_files(builder, contents):
  """What differs between the folder as `builder` (a Folder, of the folder
  now) found it and as it was when a copy named `contents` was prepared:
  ["added a/1.png", "removed b/2.png", "changed c/3.png", ...] in path
  order; None when that copy is not in data_dir any more."""
  listing = paths.join(builder.data_dir_root, builder.name, contents,
                       str(builder.version), FILES)
  try:
    before = {relative: (size, mtime) for relative, size, mtime in
              _read_lines(listing, 3)}
  except FileNotFoundError:
    return None
  now = {relative: (str(size), str(mtime))
         for relative, size, mtime in builder.builder_config.files}
  changes = []
  for relative in sorted(before.keys() | now.keys()):
    if relative not in before:
      changes.append(f"added {_printable(relative)}")
    elif relative not in now:
      changes.append(f"removed {_printable(relative)}")
    elif before[relative] != now[relative]:
      changes.append(f"changed {_printable(relative)}")
  return changes


def write_lines(path, rows):
  """Rows of fields as tab-separated lines, names as their bytes (a file
  name need not be UTF-8)."""
  paths.path(path).write_bytes("".join(
      "\t".join(str(field) for field in row) + "\n" for row in rows
  ).encode("utf-8", "surrogateescape"))


def _read_lines(path, fields):
  text = paths.path(path).read_bytes().decode("utf-8", "surrogateescape")
  return [line.split("\t", fields - 1) for line in text.split("\n") if line]
