"""Reading ArrayRecord at random: each epoch a permutation of the whole
split, resumed without reading up to the step, the same records as the
TFRecord copy; the streaming reader's hint to convert."""

import contextlib
import os
import re

import numpy as np
import pytest

from tests.util import call_tool, run_tool, small_disk
from vit_jax import errors
from vit_jax.data import (
  conversion,
  pipeline,
  preprocess,
  random_access,
  sources,
)


@contextlib.contextmanager
def full_disk(path, size):
  """tests/util.py's small_disk, whose skip where `mount` fails says so
  with the uid it ran as. Under CI=true it fails instead, as the Cloud
  Storage tests do (conftest.py's gcs_bucket): CI runs as root, and a
  skipped full-disk test there would hide what only it checks."""
  with contextlib.ExitStack() as stack:
    try:
      disk = stack.enter_context(small_disk(path, size))
    except pytest.skip.Exception as skipped:
      reason = (f"the full-disk tests need a tmpfs mounted: {skipped.msg} "
                f"(uid {os.geteuid()})")
      if os.environ.get("CI") == "true":
        pytest.fail(f"CI runs the full-disk tests: {reason}")
      pytest.skip(reason)
    yield disk


# 1,024 records in batches of 64: an epoch is 16 batches. Streamed in 16
# shares with a window of 5 of each share's 64 records, the ratio of
# ImageNet's 39 of 625 in Table 2's 2,048 shares.
SPLIT, BATCH, EPOCH_BATCHES, SHARES, WINDOW = "train[:1024]", 64, 16, 16, 5


def indices(data_dir, num_batches, **overrides):
  settings = dict(batch_size=BATCH, image_size=8, seed=0,
                  shares=range(SHARES), num_shares=SHARES)
  settings.update(overrides)
  batches = pipeline.train_dataset(sources.lookup("digits", data_dir), SPLIT,
                                   **settings)
  return [b["index"] for b in batches.take(num_batches).as_numpy_iterator()]


def epoch_overlap(batches):
  """Mean examples that batch k of an epoch shares with batch k of the
  epoch before."""
  return np.mean([len(np.intersect1d(batches[i], batches[i + EPOCH_BATCHES]))
                  for i in range(len(batches) - EPOCH_BATCHES)])


@pytest.mark.parametrize("seed", [0, 7])
def test_every_epoch_is_a_fresh_permutation_of_the_split(seed):
  order = random_access.Order(1437, seed)
  epochs = [order(np.arange(e * 1437, (e + 1) * 1437)) for e in range(3)]
  for epoch in epochs:
    np.testing.assert_array_equal(np.sort(epoch), np.arange(1437))
  assert not np.array_equal(epochs[0], epochs[1])
  assert not np.array_equal(epochs[1], epochs[2])
  # Any position is computed alone, as a resume computes it.
  late = 10**12 + 5
  np.testing.assert_array_equal(
      order([late]), order(np.arange(late - 3, late + 1))[-1:])


def test_seeds_and_epochs_are_not_interchangeable():
  # seed + epoch would make seed 0's second epoch seed 1's first.
  assert not np.array_equal(random_access.Order(100, 0)(np.arange(100, 200)),
                            random_access.Order(100, 1)(np.arange(100)))


def test_batches_of_two_epochs_overlap_as_by_chance_unlike_the_streams(
    digits_data_dir, digits_tfrecord_data_dir):
  chance = BATCH * BATCH / 1024
  at_random = epoch_overlap(indices(digits_data_dir, 4 * EPOCH_BATCHES))
  streamed = epoch_overlap(indices(digits_tfrecord_data_dir,
                                   4 * EPOCH_BATCHES,
                                   shuffle_records=SHARES * WINDOW))
  # Measured: 4.17 at random and 23.2 streamed, against 4.0 by chance
  # (3.90 streamed with a window of whole shares).
  assert 0.75 * chance < at_random < 1.25 * chance
  assert streamed > 3 * chance


def test_a_late_resume_reads_only_the_batches_it_yields(digits_data_dir,
                                                        monkeypatch):
  read = []
  real = random_access.Records.read

  def counting(self, positions):
    read.append(len(positions))
    return real(self, positions)

  monkeypatch.setattr(random_access.Records, "read", counting)
  counts = {}
  for step in (3, 10**9):
    read.clear()
    first, = indices(digits_data_dir, 1, start_step=step)
    assert first.shape == (BATCH,)
    counts[step] = sum(read)
  # The batch, and those the pipeline reads ahead (2 read at once, 2
  # decoded, 2 prefetched, the next being asked for): measured 9 or 10,
  # as the threads go, at either step.
  assert counts[3] <= 12 * BATCH and counts[10**9] <= 12 * BATCH


def test_a_converted_tfrecord_dataset_reads_the_same_records_at_random(
    digits_data_dir, digits_tfrecord_data_dir, tmp_path):
  out = str(tmp_path / "converted")
  # As docs/pods.md's command does it, in this process.
  printed = run_tool("convert_dataset", "--dataset=digits",
                     f"--data_dir={digits_tfrecord_data_dir}",
                     f"--out_data_dir={out}").splitlines()
  assert printed[0].startswith("Converting digits 1.0.0 in ")
  target, before, after = re.fullmatch(
      r"written to (\S+): ([\d.,]+) MB of ArrayRecord for ([\d.,]+) MB of "
      rf"TFRecord; train with --config.data_dir={out}", printed[-1]).groups()
  assert os.path.isdir(target) and float(before) > 0 and float(after) > 0
  assert not [name for name in os.listdir(out + "/digits/all")
              if name.endswith(".incomplete")]
  converted = sources.lookup("digits", out)
  assert random_access.readable(converted)
  # Record i is the same example in both copies: the batches of the
  # converted copy are those of digits prepared as ArrayRecord.
  for got, want in zip(indices(out, 20), indices(digits_data_dir, 20)):
    np.testing.assert_array_equal(got, want)
  same = dict(batch_size=BATCH, image_size=8, seed=3, start_step=40,
              augmentation=preprocess.augmentation("flip"))
  got = next(pipeline.train_dataset(converted, "train", **same)
             .as_numpy_iterator())
  want = next(pipeline.train_dataset(sources.lookup("digits", digits_data_dir),
                                     "train", **same).as_numpy_iterator())
  for key in want:
    np.testing.assert_array_equal(got[key], want[key])
  status, _, stderr = call_tool(
      "convert_dataset", "--dataset=digits",
      f"--data_dir={digits_tfrecord_data_dir}", f"--out_data_dir={out}")
  assert status == 2 and stderr.startswith("error: ")
  assert "already holds a prepared" in stderr
  with pytest.raises(errors.InputError, match="is ArrayRecord already"):
    conversion.convert(converted.builder, str(tmp_path / "again"))


def test_a_conversion_onto_a_full_disk_stops_in_a_line_and_keeps_nothing(
    digits_tfrecord_data_dir, tmp_path):
  builder = sources.get_builder("digits", digits_tfrecord_data_dir)
  with full_disk(tmp_path / "disk", "64k") as out:
    with pytest.raises(errors.InputError) as error:
      conversion.convert(builder, out, progress=lambda _: 0)
    message = str(error.value)
    assert message.startswith(f"could not write {out}/digits/all/1.0.0: No "
                              "space left on device (the copy needs about "
                              ), message
    assert "The partial copy was removed" in message
    assert [files for _, _, files in os.walk(out) if files] == []


def test_the_streaming_reader_hints_at_conversion_only_for_small_windows(
    digits_data_dir):
  source = sources.lookup("digits", digits_data_dir)
  # ImageNet's 1,281,167 training images in 2,048 shares, and in 8.
  hint = pipeline.shuffle_hint(source, "train", 39, 625)
  assert "within 39 of its 625 records" in hint
  assert ("python -m vit_jax.convert_dataset --dataset=digits "
          "--data_dir=DATA_DIR --out_data_dir=OUT") in hint
  assert pipeline.shuffle_hint(source, "train", 10_000, 160_146) is None
  # Digits in 16 shares: each share fits its window whole.
  assert pipeline.shuffle_hint(source, "train", 5_000, 90) is None
