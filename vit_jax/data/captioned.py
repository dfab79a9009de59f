"""A folder of captioned images as a TFDS dataset: `dataset =
"captions:/path/to/root"`.

The root holds one JSON-lines file per split, `<split>.jsonl`
(train.jsonl, test.jsonl, ...), each line one image:

  {"image": "photos/0001.jpg", "caption": "a dog on a beach"}
  {"image": "photos/0002.jpg", "captions": ["a cat", "a cat asleep"]}

"image" is a path relative to the root (or a URL); "caption" one text,
"captions" several, of which training draws one per image at each place
in the stream (data/pipeline.py). The prepared dataset has an "image"
feature (the file's bytes as they are) and "captions" (a sequence of
texts); no labels. Images are decoded once when the folder is prepared:
one that does not decode is left out and listed in broken_files.txt, as a
class folder's are (data/folder.py), and a line that is not an image with
a caption is an error naming its file and line.

Prepared into `data_dir/captioned/<config>/1.0.0`, the config named by
the root's base name and a hash of its path and of the JSON-lines files'
bytes: editing a captions file prepares a new copy. An image replaced
under the same name with no line changed is not noticed: name a new file.
"""

import dataclasses
import hashlib
import json
import re

import tensorflow_datasets as tfds
from etils import epath

from vit_jax import errors, paths
from vit_jax.data import folder

PREFIX = "captions:"
LINES = ".jsonl"
_SPLIT_NAME = re.compile(r"[\w-]+")  # What TFDS accepts in split names.


@dataclasses.dataclass(eq=False)
class CaptionedConfig(tfds.core.BuilderConfig):
  """A captioned folder's lines when read; the name is their fingerprint.

  splits: ((split, ((image path, (caption, ...)), ...)), ...), sorted by
  split, each split in its file's order.
  """
  root: str = ""
  splits: tuple = dataclasses.field(default=(), repr=False)


def _parse(line, where):
  """(image path, captions) of one JSON line."""
  try:
    entry = json.loads(line)
  except json.JSONDecodeError as e:
    raise errors.InputError(f"{where}: not JSON ({e.msg})") from None
  if not isinstance(entry, dict) or not isinstance(entry.get("image"), str):
    raise errors.InputError(f"{where}: each line is an object with an "
                            "\"image\" path")
  captions = entry.get("captions", entry.get("caption"))
  if isinstance(captions, str):
    captions = [captions]
  if (not isinstance(captions, list) or not captions
      or not all(isinstance(text, str) for text in captions)):
    raise errors.InputError(
        f"{where}: give \"caption\" (a text) or \"captions\" (a list of "
        "texts) beside the image")
  return entry["image"], tuple(captions)


def make_config(root):
  """Reads the root's JSON-lines files into a CaptionedConfig named by
  their contents."""
  if not root:
    raise errors.InputError(
        f"dataset {PREFIX!r} names no folder: use {PREFIX}PATH")
  root = (str(paths.path(root)) if paths.is_url(root)
          else paths.shown(paths.path(root).expanduser()))
  directory = paths.path(root)
  if not directory.is_dir():
    raise errors.InputError(f"dataset {PREFIX}{root}: no such folder")
  files = sorted(child for child in directory.iterdir()
                 if child.name.endswith(LINES))
  if not files:
    raise errors.InputError(
        f"dataset {PREFIX}{root}: no <split>{LINES} file (train{LINES}: "
        "one JSON object a line, an image path and its caption or "
        "captions)")
  digest = hashlib.sha256(root.encode())
  splits = []
  for path in files:
    split = path.name[:-len(LINES)]
    if not _SPLIT_NAME.fullmatch(split):
      raise errors.InputError(
          f"{path}: a split's name is letters, digits, '_' and '-'")
    data = path.read_bytes()
    digest.update(path.name.encode() + b"\0" + data)
    lines = data.decode("utf-8").splitlines()
    examples = tuple(_parse(line, f"{path}, line {number}")
                     for number, line in enumerate(lines, 1) if line.strip())
    if not examples:
      raise errors.InputError(f"{path}: no lines")
    splits.append((split, examples))
  base = re.sub(r"[^\w-]+", "_", directory.name).strip("_")[:40]
  name = (f"{base}-" if base else "") + digest.hexdigest()[
      :folder.HASH_LENGTH]
  return CaptionedConfig(name=name, root=root, splits=tuple(splits),
                         description=f"The captioned images of {root}.")


class Captioned(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A folder's captioned images; construct with config=make_config()."""

  name = "captioned"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Images stored as they are, with their "
                            "captions; files that do not decode left out "
                            f"and listed in {folder.BROKEN_FILES}."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return epath.Path(__file__)

  def _create_builder_config(self, builder_config, version):
    if isinstance(builder_config, CaptionedConfig):
      return builder_config
    raise ValueError("a Captioned dataset needs config=captioned."
                     "make_config(PATH)")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, description=self.builder_config.description,
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3)),
            "captions": tfds.features.Sequence(tfds.features.Text()),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(examples)
            for split, examples in self.builder_config.splits}

  def _download_and_prepare(self, dl_manager, download_config):
    self._broken = []
    super()._download_and_prepare(dl_manager, download_config)
    folder.write_lines(paths.join(self.data_dir, folder.BROKEN_FILES),
                       sorted(self._broken))

  def _generate_examples(self, examples):
    for number, (relative, captions) in enumerate(examples):
      image = (relative if paths.is_url(relative)
               else paths.join(self.builder_config.root, relative))
      try:
        encoded = paths.path(image).read_bytes()
      except FileNotFoundError:
        self._broken.append((relative, "no such file"))
        continue
      reason = folder.undecodable(encoded)
      if reason:
        self._broken.append((relative, reason))
        continue
      # The line's place: one image may be listed twice, with other
      # captions.
      yield number, {"image": encoded, "captions": list(captions)}
