"""`folder:PATH` datasets: layouts, labels, shares, fresh copies, errors."""

import collections
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.test_random_access import full_disk
from tests.util import (
  metric_rows,
  run_training,
  small_config,
  stored_examples,
)
from vit_jax import errors
from vit_jax.data import folder, pipeline as pipeline_lib, preprocess, sources

CLASSES = ["apple", "banana", "cherry"]
# (split, class, file name, (height, width), mode): every image a solid
# colour of its own; sizes, formats, extension cases and modes vary.
IMAGES = [
    ("train", "apple", "a.png", (5, 7), "rgb"),
    ("train", "apple", "b.JPG", (12, 9), "gray"),
    ("train", "apple", "c.jpeg", (16, 16), "rgb"),
    ("train", "banana", "d.png", (3, 20), "gray"),
    ("train", "banana", "e.jpg", (8, 8), "rgb"),
    ("train", "cherry", "f.PNG", (9, 4), "rgba"),
    ("train", "cherry", "g.png", (1, 1), "rgb"),
    ("test", "apple", "h.jpg", (10, 6), "rgb"),
    ("test", "cherry", "i.png", (7, 7), "gray"),
    ("test", "cherry", "j.jpeg", (6, 11), "gray"),
]
# Well apart, so that JPEG's few levels of error cannot confuse two images.
TOLERANCE = 8


def colour(index, mode):
  """The RGB colour (0..255) of image `index` as the pipeline decodes it."""
  level = 20 + 20 * index
  return (level,) * 3 if mode == "gray" else (level, 255 - level, 60)


def write_image(path, index, size, mode):
  rgb = colour(index, mode)
  if mode == "gray":
    pixels = np.full(size + (1,), rgb[0], np.uint8)
  elif mode == "rgba":  # Fully transparent: the stored colour must survive.
    pixels = np.full(size + (4,), rgb + (0,), np.uint8)
  else:
    pixels = np.full(size + (3,), rgb, np.uint8)
  if path.lower().endswith(".png"):
    encoded = tf.io.encode_png(pixels)
  else:
    encoded = tf.io.encode_jpeg(pixels, quality=95)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(encoded.numpy())


def make_folder(root, single_split=False, images=IMAGES):
  """Writes `images` under root; returns {relative path: (colour, label)}."""
  expected = {}
  for index, (split, name, file_name, size, mode) in enumerate(images):
    if single_split:
      if split != "train":
        continue
      relative = f"{name}/{file_name}"
    else:
      relative = f"{split}/{name}/{file_name}"
    write_image(os.path.join(root, relative), index, size, mode)
    expected[relative] = (colour(index, mode), CLASSES.index(name))
  return expected


@pytest.fixture(scope="module")
def split_layout(tmp_path_factory):
  """(dataset, data_dir, {split: [(colour, label)]}), prepared once."""
  root = str(tmp_path_factory.mktemp("images") / "fruit")
  expected = make_folder(root)
  # Ignored: hidden files, other extensions, a hidden folder.
  with open(os.path.join(root, "README.txt"), "w") as f:
    f.write("not an image")
  write_image(os.path.join(root, "train", "apple", ".hidden.png"), 0, (2, 2),
              "rgb")
  write_image(os.path.join(root, ".cache", "x", "y.png"), 0, (2, 2), "rgb")
  with open(os.path.join(root, "test", "cherry", "notes.txt"), "w") as f:
    f.write("ignored")
  by_split = collections.defaultdict(list)
  for relative, value in expected.items():
    by_split[relative.split("/")[0]].append(value)
  data_dir = str(tmp_path_factory.mktemp("tensorflow_datasets"))
  dataset = folder.PREFIX + root
  sources.get_builder(dataset, data_dir)
  return dataset, data_dir, dict(by_split)


def eval_examples(dataset, split, data_dir, shares=(0,), num_shares=1):
  """[(RGB colour 0..255, label)] of the real examples of an evaluation."""
  batches = list(
      pipeline_lib.eval_dataset(sources.lookup(dataset, data_dir),
                                split,
                                batch_size=4 * num_shares,
                                image_size=6,
                                shares=shares,
                                num_shares=num_shares).as_numpy_iterator())
  examples = []
  for batch in batches:
    assert batch["image"].shape[1:] == (6, 6, 3)
    assert batch["image"].dtype == np.uint8
    for image, label, mask in zip(batch["image"], batch["label"],
                                  batch["mask"]):
      if mask:
        # A solid colour stays solid through the resize.
        assert np.ptp(image, axis=(0, 1)).max() < 2 * TOLERANCE
        examples.append((image.mean(axis=(0, 1)), int(label)))
  return examples


def identify(examples, expected):
  """Indices into `expected` [(colour, label)] of each decoded example."""
  found = []
  for rgb, label in examples:
    matches = [i for i, (colour_, label_) in enumerate(expected)
               if np.abs(np.subtract(rgb, colour_)).max() <= TOLERANCE]
    assert len(matches) == 1, f"{rgb} matches images {matches}"
    assert expected[matches[0]][1] == label, f"{rgb}: label {label}"
    found.append(matches[0])
  return found


def test_classes_are_the_sorted_folder_names_of_all_splits(split_layout):
  dataset, data_dir, _ = split_layout
  assert sources.lookup(dataset, data_dir).num_classes == 3
  builder = sources.get_builder(dataset, data_dir)
  assert builder.info.features["label"].names == CLASSES
  assert set(builder.info.splits) == {"train", "test"}
  assert sources.lookup(dataset, data_dir).num_examples("train") == 7
  assert sources.lookup(dataset, data_dir).num_examples("test") == 3
  assert sources.lookup(dataset, data_dir).num_examples("train[:4]") == 4


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_image_comes_back_once_with_its_label(split_layout, split):
  dataset, data_dir, expected = split_layout
  found = identify(eval_examples(dataset, split, data_dir), expected[split])
  assert sorted(found) == list(range(len(expected[split])))
  if split == "test":  # banana has no test images; cherry is still 2.
    assert {label for _, label in expected[split]} == {0, 2}


def test_images_are_stored_byte_for_byte(split_layout):
  dataset, data_dir, _ = split_layout
  root = dataset[len(folder.PREFIX):]
  builder = sources.get_builder(dataset, data_dir)
  stored = sorted(example["image"]
                  for example in stored_examples(builder, "train"))
  files = []
  for split, name, file_name, _, _ in IMAGES:
    if split == "train":
      with open(os.path.join(root, split, name, file_name), "rb") as f:
        files.append(f.read())
  assert stored == sorted(files)


@pytest.mark.parametrize("num_shares", [2, 3])
def test_shares_are_disjoint_and_cover_the_split(split_layout, num_shares):
  dataset, data_dir, expected = split_layout
  shares = [identify(eval_examples(dataset, "train", data_dir, shares=(s,),
                                   num_shares=num_shares), expected["train"])
            for s in range(num_shares)]
  assert all(shares)
  every = [index for share in shares for index in share]
  assert sorted(every) == list(range(7))  # Disjoint, and all of them.


def test_train_batches_are_rgb_in_range_with_random_crop(split_layout):
  dataset, data_dir, expected = split_layout
  batches = list(
      pipeline_lib.train_dataset(sources.lookup(dataset, data_dir),
                                 "train",
                                 batch_size=7,
                                 image_size=6,
                                 augmentation=preprocess.augmentation(
                                     "random_crop,flip"),
                                 seed=1).take(2).as_numpy_iterator())
  assert len(batches) == 2  # The checks below ran, on two batches.
  for batch in batches:
    assert batch["image"].shape == (7, 6, 6, 3)
    assert batch["image"].dtype == np.uint8
    examples = [(image.mean(axis=(0, 1)), int(label))
                for image, label in zip(batch["image"], batch["label"])]
    assert sorted(identify(examples, expected["train"])) == list(range(7))


def test_single_split_layout_is_train_and_can_be_sliced(tmp_path):
  root = str(tmp_path / "fruit")
  expected = list(make_folder(root, single_split=True).values())
  dataset, data_dir = folder.PREFIX + root, str(tmp_path / "data")
  builder = sources.get_builder(dataset, data_dir)
  assert list(builder.info.splits) == ["train"]
  assert builder.info.features["label"].names == CLASSES
  assert sources.lookup(dataset, data_dir).num_examples("train") == 7
  head = identify(eval_examples(dataset, "train[:5]", data_dir), expected)
  tail = identify(eval_examples(dataset, "train[5:]", data_dir), expected)
  assert len(head) == 5 and len(tail) == 2
  assert sorted(head + tail) == list(range(7))
  with pytest.raises(errors.InputError,
                     match=r"Unknown split 'test'.*'train\[:90%\]'"):
    pipeline_lib.eval_dataset(sources.lookup(dataset, data_dir),
                              "test",
                              batch_size=4,
                              image_size=6)
  with pytest.raises(errors.InputError, match=r"train\[90%:\]"):
    sources.lookup(dataset, data_dir).num_examples("validation")


def test_a_changed_folder_is_prepared_afresh(tmp_path):
  root = tmp_path / "fruit"
  make_folder(str(root), single_split=True)
  dataset, data_dir = folder.PREFIX + str(root), str(tmp_path / "data")
  first = sources.get_builder(dataset, data_dir)
  assert sources.lookup(dataset, data_dir).num_examples("train") == 7

  write_image(str(root / "banana" / "new.png"), 11, (4, 4), "rgb")
  second = sources.get_builder(dataset, data_dir)
  assert second.data_dir != first.data_dir
  assert sources.lookup(dataset, data_dir).num_examples("train") == 8
  assert os.path.isdir(first.data_dir)  # The old copy is left alone.

  # Unchanged: the same copy, not prepared again.
  assert sources.get_builder(dataset, data_dir).data_dir == (
      second.data_dir)
  # Replaced (new mtime) or removed: another config.
  names = {folder.make_config(str(root)).name}
  os.utime(root / "banana" / "new.png", ns=(1, 1))
  names.add(folder.make_config(str(root)).name)
  os.remove(root / "banana" / "new.png")
  names.add(folder.make_config(str(root)).name)
  assert len(names) == 3
  assert folder.make_config(str(root)).name == first.builder_config.name


def test_config_name_is_readable_and_valid(tmp_path):
  root = tmp_path / "my photos!"
  make_folder(str(root), single_split=True)
  name = folder.make_config(str(root)).name
  assert name.startswith("my_photos-")
  assert len(name) == len("my_photos-") + folder.HASH_LENGTH


def test_processes_preparing_a_folder_at_once_all_succeed(tmp_path,
                                                          monkeypatch):
  root = str(tmp_path / "fruit")
  make_folder(root, single_split=True)
  dataset, data_dir = folder.PREFIX + root, str(tmp_path / "data")
  split_generators = folder.Folder._split_generators

  def another_process_finishes_first(self, dl_manager):
    monkeypatch.setattr(folder.Folder, "_split_generators", split_generators)
    folder.Folder(config=folder.make_config(root),
                  data_dir=data_dir).download_and_prepare(
                      download_config=tfds.download.DownloadConfig(
                          try_download_gcs=False))
    return split_generators(self, dl_manager)

  monkeypatch.setattr(folder.Folder, "_split_generators",
                      another_process_finishes_first)
  assert sources.lookup(dataset, data_dir).num_examples("train") == 7


def write_png(path):
  write_image(str(path), 0, (2, 2), "rgb")


def folder_error(root, data_dir):
  with pytest.raises(errors.InputError) as error:
    sources.get_builder(folder.PREFIX + str(root), str(data_dir))
  return str(error.value)


def test_folders_without_images_are_clear_errors(tmp_path):
  data_dir = tmp_path / "data"
  empty = tmp_path / "empty"
  empty.mkdir()
  message = folder_error(empty, data_dir)
  assert str(empty) in message and "is empty" in message

  no_images = tmp_path / "no_images"
  no_images.mkdir()
  (no_images / "notes.txt").write_text("x")
  (no_images / "photo.gif").write_text("x")
  message = folder_error(no_images, data_dir)
  assert str(no_images) in message and "no folders of images" in message

  # A class folder holding no images, in either layout.
  single = tmp_path / "single"
  write_png(single / "cat" / "1.png")
  (single / "dog").mkdir()
  (single / "dog" / "readme.txt").write_text("x")
  message = folder_error(single, data_dir)
  assert str(single / "dog") in message and "no images" in message

  splits = tmp_path / "splits"
  write_png(splits / "train" / "cat" / "1.png")
  (splits / "test" / "cat").mkdir(parents=True)
  message = folder_error(splits, data_dir)
  assert str(splits / "test" / "cat") in message and "no images" in message
  assert not data_dir.exists()  # Nothing was prepared.


def test_malformed_folders_are_clear_errors(tmp_path):
  data_dir = tmp_path / "data"
  missing = tmp_path / "missing"
  assert "not a directory" in folder_error(missing, data_dir)

  loose = tmp_path / "loose"
  write_png(loose / "1.png")
  message = folder_error(loose, data_dir)
  assert str(loose) in message and "1.png" in message

  mixed = tmp_path / "mixed"
  write_png(mixed / "cat" / "1.png")
  write_png(mixed / "train" / "dog" / "1.png")
  message = folder_error(mixed, data_dir)
  assert str(mixed) in message and "mixes split folders" in message

  nested = tmp_path / "nested"
  write_png(nested / "train" / "cat" / "1.png")
  write_png(nested / "train" / "cat" / "more" / "2.png")
  message = folder_error(nested, data_dir)
  assert str(nested / "train" / "cat") in message

  bad_split = tmp_path / "bad_split"
  write_png(bad_split / "all" / "cat" / "1.png")
  assert "'all'" in folder_error(bad_split, data_dir)

  with pytest.raises(errors.InputError, match="names no folder"):
    sources.get_builder(folder.PREFIX, str(data_dir))


def test_file_names_that_are_not_utf8_are_read_and_class_names_refused(
    tmp_path):
  root = str(tmp_path / "fruit")
  expected = list(make_folder(root, single_split=True).values())
  # Latin-1 names, as an old camera or a Windows archive leaves them.
  apple = os.fsencode(os.path.join(root, "apple"))
  with open(os.path.join(root, "apple", "a.png"), "rb") as f:
    png = f.read()
  os.rename(os.path.join(root, "apple", "a.png"), apple + b"/caf\xe9.png")
  with open(apple + b"/d\xe9j\xe0.png", "wb") as f:
    f.write(png[:len(png) // 2])
  dataset, data_dir = folder.PREFIX + root, str(tmp_path / "data")
  builder = sources.get_builder(dataset, data_dir)
  assert [relative for relative, _ in folder.broken_files(builder)] == [
      os.fsdecode(b"apple/d\xe9j\xe0.png")]
  found = identify(eval_examples(dataset, "train", data_dir), expected)
  assert sorted(found) == list(range(7))  # café.png among them.

  os.rename(apple, os.fsencode(os.path.join(root, "")) + b"pomme \xe0")
  message = folder_error(root, tmp_path / "data2")
  assert "'pomme \\xe0' is not UTF-8: rename it" in message, message


def test_a_disk_that_fills_while_preparing_stops_in_a_line_and_keeps_nothing(
    tmp_path):
  root = tmp_path / "noise"
  rng = np.random.default_rng(0)
  for name in ("a", "b"):  # 20 noise PNGs of 12 kB: 250 kB, for 150 kB.
    for i in range(10):
      pixels = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
      os.makedirs(root / name, exist_ok=True)
      (root / name / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
  with full_disk(tmp_path / "disk", "150k") as data_dir:
    message = folder_error(root, data_dir)
    assert message.startswith(
        f"could not prepare folder in {data_dir}/folder/noise-"), message
    assert re.search(r"No space left on device \(its images take 2\d\d kB, "
                     r".*; 15\d kB are free\)", message), message
    assert "Nothing of it was kept" in message and "\n" not in message
    assert [files for _, _, files in os.walk(data_dir) if files] == []
    assert not os.path.exists(os.path.join(data_dir, "folder"))


def odd_and_broken_folder(root):
  """A single-split folder: IMAGES' 7 train images, 4 images that decode
  but are unusual, and 4 files that do not decode. Returns ({relative path:
  (colour, label)} of the usable ones, [relative paths of the broken])."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  expected = make_folder(root, single_split=True)
  odd = [  # (class, file name, PIL image, its colour as the pipeline sees it)
      ("apple", "cmyk.jpg",
       Image.new("RGB", (9, 7), (200, 100, 50)).convert("CMYK"),
       (200, 100, 50)),
      ("banana", "deep.png", Image.fromarray(np.full((6, 5), 40_000,
                                                     np.uint16)),
       (156,) * 3),  # 40000 / 65535 of 255.
      ("cherry", "gray_alpha.png", Image.fromarray(
          np.full((5, 6, 2), (230, 0), np.uint8), "LA"), (230,) * 3),
      ("cherry", "palette.png",
       Image.new("RGB", (4, 4), (40, 180, 250)).convert(
           "P", palette=Image.Palette.ADAPTIVE),
       (40, 180, 250)),
  ]
  for name, file_name, image, rgb in odd:
    image.save(os.path.join(root, name, file_name), quality=95)
    expected[f"{name}/{file_name}"] = (rgb, CLASSES.index(name))
  with open(os.path.join(root, "apple", "c.jpeg"), "rb") as f:
    jpeg = f.read()
  with open(os.path.join(root, "apple", "a.png"), "rb") as f:
    png = f.read()
  broken = {"apple/page.jpg": b"<html>not an image</html>",
            "banana/cut.jpg": jpeg[:len(jpeg) // 2],
            "banana/cut.png": png[:len(png) // 2],
            "cherry/empty.png": b""}
  for relative, data in broken.items():
    with open(os.path.join(root, relative), "wb") as f:
      f.write(data)
  return expected, sorted(broken)


def test_files_that_do_not_decode_are_left_out_and_named(tmp_path, capsys):
  root = str(tmp_path / "fruit")
  expected, broken = odd_and_broken_folder(root)
  dataset, data_dir = folder.PREFIX + root, str(tmp_path / "data")
  builder = sources.get_builder(dataset, data_dir)
  listed = folder.broken_files(builder)
  assert [relative for relative, _ in listed] == broken
  assert all(reason for _, reason in listed)
  assert dict(listed)["cherry/empty.png"] == "empty file"
  printed = capsys.readouterr().out
  assert f"Left out 4 of 15 files of {root}" in printed
  assert folder.BROKEN_FILES in printed and broken[0] in printed
  # Every usable image, the odd ones too, and only those.
  assert sources.lookup(dataset, data_dir).num_examples("train") == 11
  found = identify(eval_examples(dataset, "train", data_dir),
                   list(expected.values()))
  assert sorted(found) == list(range(11))
  # Opened again, the prepared copy is used and says nothing.
  sources.get_builder(dataset, data_dir)
  assert capsys.readouterr().out == ""


def test_a_run_trains_past_broken_files_or_refuses_them(tmp_path):
  root = str(tmp_path / "fruit")
  _, broken = odd_and_broken_folder(root)
  data_dir = str(tmp_path / "data")
  folder_run = {"dataset": folder.PREFIX + root, "train_split": "train[:7]",
                "evaluators.test.split": "train[7:]", "image_size": 8}
  config = small_config(data_dir, **folder_run)
  result = run_training(config, str(tmp_path / "run"))
  # Scored on the 4 usable images after the first 7, the broken ones left
  # out: a whole number of them right.
  assert result["test_examples"] == 4
  assert result["test_accuracy"] * 4 in (0, 1, 2, 3, 4)
  steps = [row["step"] for row in metric_rows(str(tmp_path / "run"))]
  assert steps[-1] == config.total_steps
  refusing = small_config(data_dir, broken_images="refuse", **folder_run)
  with pytest.raises(errors.ConfigError, match="4 files of .* do not decode"
                     ) as refused:
    run_training(refusing, str(tmp_path / "refused"))
  assert broken[0] in str(refused.value)
  with pytest.raises(errors.ConfigError, match="broken_images must be one"):
    run_training(small_config(data_dir, broken_images="maybe", **folder_run),
                 str(tmp_path / "typo"))


def test_a_folder_is_scanned_once_per_run_and_its_changes_refused_on_resume(
    tmp_path, monkeypatch):
  root = str(tmp_path / "fruit")
  make_folder(root, single_split=True)
  scans = []
  real_scan = folder.scan
  monkeypatch.setattr(folder, "scan",
                      lambda path: scans.append(path) or real_scan(path))
  config = small_config(str(tmp_path / "data"), **{
      "dataset": folder.PREFIX + root, "train_split": "train[:75%]",
      "evaluators.test.split": "train[75%:]", "evaluators.test.every": 2,
      "image_size": 8, "total_steps": 6})
  config.evaluators.held = dict(kind="accuracy", every=2, split="train[:4]")
  workdir = str(tmp_path / "run")
  result = run_training(config, workdir)
  # Three evaluations by each of two evaluators, a training stream, the
  # preparation: one walk of the folder.
  assert {"test_accuracy", "held_accuracy"} <= set(result)
  assert scans == [root]

  before = folder.make_config(root).name
  # Edited since: the 75% slices would shift. The resume is refused, the
  # files named, before the folder is prepared again.
  os.remove(os.path.join(root, "apple", "a.png"))
  write_image(os.path.join(root, "banana", "new.png"), 11, (4, 4), "rgb")
  longer = small_config(str(tmp_path / "data"), **{
      "dataset": folder.PREFIX + root, "train_split": "train[:75%]",
      "evaluators.test.split": "train[75%:]", "evaluators.test.every": 2,
      "image_size": 8, "total_steps": 8})
  prepared = os.listdir(tmp_path / "data" / "folder")
  with pytest.raises(errors.ConfigError) as refused:
    run_training(longer, workdir)
  now = folder.make_config(root).name
  message = str(refused.value)
  assert ("changed since the run in" in message and
          "(2: removed apple/a.png, added banana/new.png)" in message and
          f"--config.folder_contents={now} " in message), message
  assert os.listdir(tmp_path / "data" / "folder") == prepared

  # Named: the run goes on, on the new copy, and the change is recorded.
  longer.folder_contents = now
  run_training(longer, workdir)
  with open(os.path.join(workdir, "config_changes.jsonl")) as f:
    change = json.loads(f.read().splitlines()[-1])["changes"]
  assert change["folder_contents"] == {"old": before, "new": now}
  assert metric_rows(workdir)[-1]["step"] == 8
