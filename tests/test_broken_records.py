"""TFDS records whose image does not decode: dropped, counted and named in
training and evaluation, the same records after a resume."""

import glob
import logging
import os
import shutil

import grain
import numpy as np
import pytest
import tensorflow as tf
from array_record.python import array_record_module

from tests.util import (
  assert_trees_equal,
  latest_checkpoint,
  made_once,
  metric_rows,
  run_training,
  sigterm_at_step,
  small_config,
)
from vit_jax import errors
from vit_jax.data import conversion, pipeline, preprocess, sources

# Positions in each split of the prepared digits whose image bytes are
# replaced: by bytes that are no image, or by the first half of a PNG.
BROKEN = {"train": {3: "garbage", 100: "truncated", 250: "garbage"},
          "test": {7: "truncated", 200: "garbage"}}
# One epoch of train[:256] in 4 shares of 64 is 8 steps of 32 examples.
EPOCH = {"train_split": "train[:256]", "total_steps": 8}


def break_records(data_dir):
  """Rewrites the prepared digits in `data_dir` with BROKEN's images, in the
  format they are stored in."""
  folder = os.path.join(data_dir, "digits", "all", "1.0.0")
  for split, broken in BROKEN.items():
    path, = glob.glob(os.path.join(folder, f"digits-{split}.*-00000-of-00001"))
    array_record = ".array_record-" in path
    if array_record:
      records = list(grain.sources.ArrayRecordDataSource([path]))
    else:
      records = [bytes(r) for r in tf.data.TFRecordDataset(path)
                 .as_numpy_iterator()]
    for position, kind in broken.items():
      example = tf.train.Example.FromString(records[position])
      image = example.features.feature["image"].bytes_list.value
      image[0] = (b"not an image" if kind == "garbage"
                  else image[0][:len(image[0]) // 2])
      records[position] = example.SerializeToString()
    if array_record:
      writer = array_record_module.ArrayRecordWriter(
          path, conversion.WRITER_OPTIONS)
      for record in records:
        writer.write(record)
      writer.close()
    else:
      with tf.io.TFRecordWriter(path) as writer:
        for record in records:
          writer.write(record)


def broken_copy(tmp_path_factory, name, data_dir):
  def make(path):
    shutil.copytree(os.path.join(data_dir, "digits"),
                    os.path.join(path, "digits"))
    break_records(path)
  return made_once(tmp_path_factory, name, make)


@pytest.fixture(scope="module")
def broken_digits(digits_data_dir, tmp_path_factory):
  """A data_dir whose digits (ArrayRecord) hold the BROKEN records."""
  return broken_copy(tmp_path_factory, "broken_digits", digits_data_dir)


@pytest.fixture(scope="module")
def broken_tfrecord_digits(digits_tfrecord_data_dir, tmp_path_factory):
  """The same, for digits stored as TFRecord (the streaming reader)."""
  return broken_copy(tmp_path_factory, "broken_tfrecord_digits",
                     digits_tfrecord_data_dir)


@pytest.fixture(params=["array_record", "tfrecord"])
def clean_and_broken(request):
  """(intact data_dir, broken data_dir) in each format."""
  if request.param == "array_record":
    names = ("digits_data_dir", "broken_digits")
  else:
    names = ("digits_tfrecord_data_dir", "broken_tfrecord_digits")
  return tuple(request.getfixturevalue(name) for name in names)


def one_epoch(data_dir):
  """The rows of the first epoch of digits train[:256], 4 shares."""
  batches = pipeline.train_dataset(sources.lookup("digits", data_dir),
                                   "train[:256]",
                                   batch_size=32,
                                   image_size=8,
                                   augmentation=preprocess.augmentation(
                                       "flip"),
                                   shares=range(4),
                                   num_shares=4)
  rows = list(batches.take(8).as_numpy_iterator())
  return {key: np.concatenate([r[key] for r in rows]) for key in rows[0]}


def test_training_rows_of_broken_records_are_masked_and_the_rest_kept(
    clean_and_broken):
  clean, broken = (one_epoch(data_dir) for data_dir in clean_and_broken)
  # Every record once, in the same places as in the intact dataset.
  np.testing.assert_array_equal(np.sort(broken["index"]), np.arange(256))
  np.testing.assert_array_equal(broken["index"], clean["index"])
  dropped = broken["mask"] == 0
  assert set(broken["index"][dropped]) == set(BROKEN["train"])
  assert not broken["image"][dropped].any()
  # No usable image lost or changed: augmentations included.
  np.testing.assert_array_equal(broken["image"][~dropped],
                                clean["image"][~dropped])
  np.testing.assert_array_equal(broken["label"][~dropped],
                                clean["label"][~dropped])
  assert (clean["mask"] == 1).all()


def test_evaluation_rows_of_broken_records_are_masked_like_padding(
    clean_and_broken):
  rows = list(
      pipeline.eval_dataset(sources.lookup("digits", clean_and_broken[1]),
                            "test",
                            batch_size=64,
                            image_size=8,
                            shares=range(4),
                            num_shares=4).as_numpy_iterator())
  index = np.concatenate([r["index"] for r in rows])
  mask = np.concatenate([r["mask"] for r in rows])
  assert set(index[(mask == 0) & (index >= 0)]) == set(BROKEN["test"])
  scored = index[mask == 1]
  np.testing.assert_array_equal(
      np.sort(scored), sorted(set(range(360)) - set(BROKEN["test"])))


def config_for(data_dir, **overrides):
  return small_config(data_dir, **{**EPOCH, "log_every": 4,
                                   "checkpoint_every": 4,
                                   "evaluators.test.every": 8, **overrides})


def test_a_run_trains_to_the_end_and_resumed_drops_the_same_records(
    broken_digits, tmp_path, monkeypatch, caplog):
  # Two epochs: each drops every broken record once.
  config = config_for(broken_digits, total_steps=16, log_every=1,
                      checkpoint_every=16, **{"evaluators.test.every": 16})
  whole = str(tmp_path / "whole")
  caplog.set_level(logging.WARNING)
  expected = run_training(config, whole)
  assert expected["train_skipped_examples"] == 2 * len(BROKEN["train"])
  assert expected["test_skipped_examples"] == len(BROKEN["test"])
  assert expected["test_examples"] == 360 - len(BROKEN["test"])
  named = " ".join(caplog.messages)
  for position in BROKEN["train"]:
    assert f"Skipped example {position} of digits train[:256]" in named
  for position in BROKEN["test"]:
    assert f"Skipped example {position} of digits test" in named

  parted = str(tmp_path / "parted")
  with monkeypatch.context() as patch:
    sigterm_at_step(patch, 5)
    assert run_training(config, parted)["stopped_at_step"] == 5
  result = run_training(config, parted)
  assert result["train_skipped_examples"] == 2 * len(BROKEN["train"])
  assert_trees_equal(latest_checkpoint(parted, config)[1],
                     latest_checkpoint(whole, config)[1])
  # The cumulative count of every step, the resume's included.
  counts = lambda workdir: [r["train_skipped_examples"]
                            for r in metric_rows(workdir)]
  assert counts(parted) == counts(whole)


def test_refuse_stops_the_run_at_the_first_broken_image(broken_digits,
                                                         tmp_path):
  config = config_for(broken_digits, broken_images="refuse")
  with pytest.raises(errors.InputError, match="does not decode as an image, "
                     "and config.broken_images is 'refuse'"):
    run_training(config, str(tmp_path))
