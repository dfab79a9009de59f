"""Packed training (config.naflex.packing, data/packing.py): several images
at their own sizes in each sequence, packed first-fit share by share, the
loss averaged over images; resumed runs pack as uninterrupted ones."""

import json
import math
import threading

import jax
import numpy as np
import optax
import pytest
import tensorflow as tf

from tests.util import (
  assert_trees_equal,
  call_tool,
  latest_checkpoint,
  made_once,
  metric_rows,
  program_of,
  randomize,
  run_training,
  sigterm_at_step,
  small_config,
)
from vit_jax import errors, sharding
from vit_jax.data import digits, packing, pipeline, preprocess, sources
from vit_jax.models import naflex
from vit_jax.runs import settings
from vit_jax.training import loop, resolve
from vit_jax.weights import pretrained

LENGTH, SLOTS = 16, 3
PATCH_VALUES = 2 * 2 * 3


def images(tokens, labels=None, broken=()):
  """A share's block of per-image rows, as the pipeline yields them: image
  i's label is labels[i] (default i), its patches all hold its label + 1,
  its grid is 1 x tokens."""
  n = len(tokens)
  labels = list(range(n)) if labels is None else labels
  pixels = np.zeros((n, LENGTH, PATCH_VALUES), np.uint8)
  positions = np.zeros((n, LENGTH, 2), np.int32)
  for i, count in enumerate(tokens):
    pixels[i, :count] = labels[i] + 1
    positions[i, :count, 1] = np.arange(count)
  return {"image": pixels, "positions": positions,
          "grid": np.stack([np.ones(n, np.int32), tokens], axis=1).astype(
              np.int32),
          "tokens": np.asarray(tokens, np.int32),
          "label": np.asarray(labels, np.int32),
          "mask": np.asarray([0.0 if i in broken else 1.0 for i in range(n)],
                             np.float32)}


def pack(share, block):
  """The share's sequences of this step's `block` of images."""
  out = packing._zeros(block, share.sequences, share.packing)
  share.pack(block, out)
  return out


def where_each_is(batch):
  """{label: (sequence, slot)} of each image the packed batch holds, after
  checking that its patches lie whole and contiguous under its slot."""
  found = {}
  for s in range(batch["mask"].shape[0]):
    for slot in np.flatnonzero(batch["mask"][s]):
      label = int(batch["label"][s, slot])
      where = np.flatnonzero(batch["segments"][s] == slot + 1)
      count = int(batch["grids"][s, slot].prod())
      assert len(where) == count and np.all(np.diff(where) == 1)
      assert (batch["image"][s, where] == label + 1).all()
      np.testing.assert_array_equal(batch["positions"][s, where, 1],
                                    np.arange(count))
      found[label] = (s, int(slot))
  return found


def test_each_image_goes_whole_into_the_first_sequence_with_room():
  share = packing._Share(2, packing.Packing(LENGTH, SLOTS, 2.0))
  batch = pack(share, images([10, 8, 6, 4, 2, 9], broken=(4,)))
  # 10 -> 0; 8 -> 1; 6 -> 0 (16 full); 4 -> 1 (12); 2 broken; 9 no room.
  assert where_each_is(batch) == {0: (0, 0), 1: (1, 0), 2: (0, 1),
                                  3: (1, 1)}
  assert batch["broken"].tolist() == [1, 0]
  assert batch["dropped"].tolist() == [0, 0]
  np.testing.assert_array_equal((batch["segments"] > 0).sum(axis=1),
                                [16, 12])
  # The next step's images first, then the 9 of this one where it fits.
  batch = pack(share, images([12, 3, 1, 1], labels=[10, 11, 12, 13]))
  assert where_each_is(batch) == {10: (0, 0), 11: (0, 1), 12: (0, 2),
                                  13: (1, 0), 5: (1, 1)}
  assert batch["dropped"].tolist() == [0, 0]


def test_a_sequence_holds_at_most_its_slots_and_twice_left_over_is_dropped():
  share = packing._Share(1, packing.Packing(LENGTH, SLOTS, 2.0))
  batch = pack(share, images([1, 1, 1, 1, 14]))
  assert where_each_is(batch) == {0: (0, 0), 1: (0, 1), 2: (0, 2)}
  batch = pack(share, images([16], labels=[7]))
  assert where_each_is(batch) == {7: (0, 0)}
  assert batch["dropped"].tolist() == [2]  # The 1 and the 14.
  assert batch["mask"].tolist() == [[1.0, 0.0, 0.0]]


def test_slots_default_to_twice_the_images_read_a_sequence():
  config = small_config("/nonexistent", **{
      "naflex.max_num_patches": 16, "naflex.packing": True,
      "naflex.images_per_sequence": 2.5})
  packs = packing.Packing.of(
      resolve.check_values(settings.of(config)).settings.naflex)
  assert (packs.length, packs.slots, packs.images_per_share(8)) == (16, 5, 20)


def test_dropping_keeps_a_share_of_the_patches_at_their_places():
  grid = tf.constant([3, 5])
  pixels = tf.pad(tf.repeat(tf.range(1, 16, dtype=tf.int32)[:, None], 12,
                            axis=1), [[0, 9], [0, 0]])
  kept, positions, tokens = preprocess.drop_patches(
      pixels, grid, tf.constant(0.4), tf.constant([1, 2], tf.int64))
  kept, positions, tokens = kept.numpy(), positions.numpy(), int(tokens)
  assert tokens == 15 - 6
  index = positions[:tokens, 0] * 5 + positions[:tokens, 1]
  assert np.all(np.diff(index) > 0)  # Kept in order, each once.
  np.testing.assert_array_equal(kept[:tokens, 0], index + 1)
  assert not kept[tokens:].any() and not positions[tokens:].any()
  whole, positions, tokens = preprocess.drop_patches(
      pixels, grid, tf.constant(0.0), tf.constant([1, 2], tf.int64))
  np.testing.assert_array_equal(whole.numpy(), pixels.numpy())
  assert int(tokens) == 15
  np.testing.assert_array_equal(positions.numpy()[:15],
                                np.stack(np.divmod(np.arange(15), 5), 1))


def test_an_image_keeps_its_own_size_and_only_shrinks_to_fit():
  assert naflex.native_grid(9, 15, 2, 64) == (5, 8)
  assert naflex.native_grid(9, 15, 2, 16) == naflex.grid_for(9, 15, 2, 16)
  assert naflex.native_grid(16, 16, 2, 64, scale=0.5) == (4, 4)
  # Sampled resolutions: the area s x s, s within the range.
  image = tf.zeros((30, 120, 3), tf.uint8)
  sides = [float(preprocess.sampled_scale(
      image, 8, 16, tf.constant([0, i], tf.int64))) * 60 for i in range(50)]
  assert 8 <= min(sides) < 9.5 and 14.5 < max(sides) <= 16


def test_digits_at_mixed_sizes_span_8_to_64_patches():
  sizes = [digits.mixed_size(i) for i in range(1797)]
  assert {max(size) for size in sizes} == set(range(8, 17))
  assert max(max(h / w, w / h) for h, w in sizes) <= 3.5
  counts = [np.prod(naflex.native_grid(h, w, 2, 64)) for h, w in sizes]
  assert min(counts) <= 12 and max(counts) == 64


# The session's digits model (square 8 x 8 digits), fine-tuned for 80
# steps: its head starts afresh (a new dataset), and its features of square
# digits carry little to digits of mixed sizes (0.24 on them with its own
# head, when written), so it learns them almost anew: 0.29 in a run of 12
# steps, 0.43 of 48, 0.55 of 80 when written.
PACKED = {"dataset": "digits/mixed_sizes", "image_size": 16,
          "naflex.max_num_patches": 64, "naflex.packing": True,
          "naflex.images_per_sequence": 2.5, "mesh.data": 8,
          "mesh.model": 1, "model.dropout_rate": 0.0,
          "model.hidden_size": 64, "model.mlp_dim": 128,
          "model.scan_layers": True, "input_shares": 16,
          "total_steps": 80, "log_every": 1, "checkpoint_every": 20,
          "evaluators.test.every": 80, "optimizer.warmup_steps": 2,
          "optimizer.learning_rate": 3e-3}


@pytest.fixture(scope="module")
def packed_run(digits_data_dir, digits_run, tmp_path_factory):
  config = small_config(digits_data_dir, init_from=digits_run[0], **PACKED)
  return config, made_once(tmp_path_factory, "packed_run",
                           lambda path: run_training(config, path))


def test_a_packed_run_learns_with_little_padding(packed_run):
  config, workdir = packed_run
  rows = [row for row in metric_rows(workdir) if "train_loss" in row]
  losses = [row["train_loss"] for row in rows]
  # Its head starts afresh (a new dataset): 2.29 -> 1.23 when written.
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
  padding = np.mean([row["padding_fraction"] for row in rows])
  images = np.mean([row["images_per_step"] for row in rows])
  assert padding < 0.2
  # 2.5 images read a sequence, a few of them left over.
  assert 2.0 * config.batch_size < images <= 2.5 * config.batch_size
  last = rows[-1]
  assert last["img_per_sec_per_device"] == pytest.approx(
      last["seq_per_sec_per_device"] * last["images_per_step"]
      / config.batch_size)
  accuracy = [row["test_accuracy"] for row in metric_rows(workdir)
              if "test_accuracy" in row]
  assert accuracy[-1] >= 0.5  # Chance is 0.1; 0.547 when written.


def test_a_packed_runs_logged_counts_are_its_batches(packed_run, tmp_path):
  """images_per_step, padding_fraction, dropped_fraction and the skipped
  examples, as the run logged them at its first four steps, are counted
  here from each step's packed batch itself (made again from the run's
  config): its images the distinct slots its patches name, its padding
  the patches of slot 0, the images read that found no room and those
  that did not decode (train_skipped_examples: all so far) its
  counters'."""
  config, workdir = packed_run
  rows = {row["step"]: row for row in metric_rows(workdir)
          if "train_loss" in row}
  dropped_somewhere, broken = False, 0
  for step, batch in enumerate(_batches(config, str(tmp_path), 0, 4),
                               start=1):
    segments = batch["segments"]
    images = sum(len(np.unique(row[row > 0])) for row in segments)
    assert images == batch["mask"].sum()
    dropped = int(batch["dropped"].sum())
    dropped_somewhere |= dropped > 0
    row = rows[step]
    assert row["images_per_step"] == images
    assert row["padding_fraction"] == pytest.approx(
        np.count_nonzero(segments == 0) / segments.size, rel=1e-6)
    assert row["dropped_fraction"] == pytest.approx(
        dropped / (images + dropped), rel=1e-6)
    broken += int(batch["broken"].sum())
    assert row["train_skipped_examples"] == broken
  assert dropped_somewhere  # The test can tell a count from a constant.


def test_a_packed_run_stopped_by_sigterm_resumes_bitwise(
    packed_run, tmp_path, monkeypatch):
  config, finished = packed_run
  with monkeypatch.context() as patch:
    sigterm_at_step(patch, 6)
    stopped = run_training(config, str(tmp_path))
  assert stopped["stopped_at_step"] == 6
  run_training(config, str(tmp_path))
  _, expected, _ = latest_checkpoint(finished, config)
  step, params, _ = latest_checkpoint(str(tmp_path), config)
  assert step == config.total_steps
  assert_trees_equal(params, expected)


def _batches(config, workdir, start_step, count):
  batches = loop.train_batches(resolve.run(config, workdir), start_step)
  return [next(batches) for _ in range(count)]


def test_a_resumed_stream_and_each_process_pack_as_one_uninterrupted(
    digits_data_dir, tmp_path):
  config = small_config(digits_data_dir, **PACKED)
  whole = _batches(config, str(tmp_path), 0, 4)
  resumed = _batches(config, str(tmp_path), 2, 2)
  for got, expected in zip(resumed, whole[2:]):
    assert_trees_equal(got, expected)
  # Two processes' shares (8 each of the 16), packed apart.
  run = resolve.run(config, str(tmp_path))
  source, packs = run.source, run.packing
  halves = []
  for shares in (range(8), range(8, 16)):
    rows = pipeline.train_dataset(
        source, "train", batch_size=packs.images_per_share(2) * 16,
        image_size=16, shares=tuple(shares), num_shares=16,
        naflex=run.naflex, packing=packs).as_numpy_iterator()
    rows = ({k: v for k, v in batch.items() if k != "index"}
            for batch in rows)
    halves.append(next(packing.packed(rows, 8, 2, packs)))
  assert_trees_equal(
      {k: np.concatenate([h[k] for h in halves]) for k in halves[0]},
      whole[0])


def test_the_loss_is_the_mean_over_images(digits_data_dir, tmp_path):
  """However many images each sequence holds, each image weighs the same:
  the step's loss is the mean of every image's cross-entropy."""
  config = small_config(digits_data_dir, **PACKED)
  (batch,) = _batches(config, str(tmp_path), 0, 1)
  assert len(set(batch["mask"].sum(axis=1))) > 1  # Unequal sequences.
  program = program_of(config, num_classes=10)
  state = program.init(jax.random.key(0))
  state = state.replace(params=randomize(state.params))
  logits = program.model.apply({"params": state.params}, naflex.Packed(
      batch["image"], batch["segments"], batch["positions"],
      batch["grids"]), train=False)
  losses = optax.softmax_cross_entropy_with_integer_labels(
      np.asarray(logits, np.float64), batch["label"])
  expected = float(losses[batch["mask"] > 0].mean())
  _, metrics = program.train_step(
      state, sharding.to_global(batch, program.batch_sharding))
  assert float(metrics["train_loss"]) == pytest.approx(expected, rel=1e-5)
  assert float(metrics["images_per_step"]) == batch["mask"].sum()


@pytest.mark.parametrize("overrides, says", [
    ({"naflex.token_drop": 0.5, "naflex.packing": False},
     "naflex.token_drop applies to packed"),
    ({"naflex.max_num_patches": 0}, "set it"),
    ({"naflex.min_side": 16}, "set both"),
    ({"naflex.min_side": 16, "naflex.max_side": 8}, "min_side <= max_side"),
    ({"naflex.token_drop": 0.5, "naflex.token_drop_sampled": True},
     "below 1"),
    ({"distill.teacher": "/nonexistent"}, "NaFlex images differ in shape"),
    # Fewer slots than images read a sequence: 60% left over every step.
    ({"naflex.max_images_per_sequence": 1},
     r"^config.naflex.max_images_per_sequence=1 is below "
     r"config.naflex.images_per_sequence=2.5, .*give at least 3, or 0"),
])
def test_what_a_packed_run_refuses(overrides, says):
  config = small_config("/nonexistent", **{**PACKED, **overrides})
  with pytest.raises(errors.ConfigError, match=says):
    resolve.program(settings.of(config))


@pytest.mark.parametrize("per_sequence", [1.0, 1.5, 2.0, 2.5, 7.3])
def test_the_default_slots_hold_the_images_read_a_sequence(per_sequence):
  """max_images_per_sequence 0 (twice images_per_sequence, rounded up), or
  images_per_sequence rounded up, passes the check that refuses fewer."""
  for most in (0, math.ceil(per_sequence)):
    packs = packing.Packing.of(settings.NaFlex(
        max_num_patches=64, packing=True, images_per_sequence=per_sequence,
        max_images_per_sequence=most))
    packs.check()
    assert packs.slots >= per_sequence


def test_evaluation_reads_each_image_at_its_own_size(digits_data_dir):
  source = sources.lookup("digits/mixed_sizes", digits_data_dir)
  batch = next(pipeline.eval_dataset(
      source, "test", batch_size=16, image_size=16,
      naflex=naflex.Budget(2, 64, fill=False)).as_numpy_iterator())
  records = source.builder.as_data_source(split="test")
  stored = [records[int(i)]["image"].shape[:2] for i in batch["index"]]
  assert len(set(stored)) > 4
  assert [tuple(grid) for grid in batch["grid"]] == [
      naflex.native_grid(*shape, 2, 64) for shape in stored]


def test_a_packed_step_with_the_splash_kernel_plans_on_a_tpu():
  """vit_jax.plan compiles a packed config's step for a TPU ahead of time,
  the splash kernel taking the images' slots as its segment ids."""
  from vit_jax.planning import cost, report  # pylint: disable=g-import-not-at-top
  # Unscanned: the plan compiles no loop-free twin for its estimate.
  keys = settings.of(small_config("/nonexistent", **{
      **PACKED, "mesh.data": -1, "model.attention": "splash",
      "model.scan_layers": False}))
  program, batch = cost.build_step(keys, jax.devices(), 10)
  assert batch["image"].shape == (32, 64, 2 * 2 * 3)
  assert batch["grids"].shape == batch["label"].shape + (2,) == (32, 5, 2)
  plan = cost.plan(keys, "v6e-4", classes=10)
  # Two blocks: each the forward kernel and the backward's two.
  assert plan.fits and plan.pallas_kernels == 6
  assert plan.packing == {"slots": 5, "images_per_sequence": 2.5}
  assert ("batch 32 sequences of up to 5 images (about 2.5 read for each), "
          "8 per device") in report.describe("packed", plan)


def test_a_packed_step_is_the_same_on_every_mesh_and_in_micro_batches(
    digits_data_dir, tmp_path):
  """Packed sequences split over data, fsdp and model axes, and into two
  micro-batches, give the step that one data axis gives whole."""
  config = small_config(digits_data_dir, **PACKED)
  (batch,) = _batches(config, str(tmp_path), 0, 1)
  results = []
  for mesh, accum_steps in (({"data": 8}, 1), ({"data": 2, "fsdp": 2,
                                                "model": 2}, 2)):
    config.mesh.update(data=mesh["data"], fsdp=mesh.get("fsdp", 1),
                       model=mesh.get("model", 1))
    config.accum_steps = accum_steps
    program = program_of(config, num_classes=10)
    state = program.init(jax.random.key(0))
    state = state.replace(params=randomize(state.params))
    state, metrics = program.train_step(
        state, sharding.to_global(batch, program.batch_sharding))
    results.append((jax.device_get(metrics), jax.device_get(state.params)))
  (one, params), (other, other_params) = results
  for key in ("train_loss", "grad_norm", "images_per_step",
              "padding_fraction"):
    assert other[key] == pytest.approx(one[key], rel=1e-5), key
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(other_params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_predict_reads_images_at_their_own_size_as_a_packed_run_evaluates(
    packed_run, digits_run, tmp_path):
  _, workdir = packed_run
  shapes = [(9, 15), (16, 16), (4, 12)]
  files = []
  for i, shape in enumerate(shapes):
    files.append(str(tmp_path / f"{i}.png"))
    tf.io.write_file(files[-1], tf.io.encode_png(np.full(
        (*shape, 3), 40 * i, np.uint8)))
  status, out, err = call_tool("predict", f"--workdir={workdir}",
                               "--max_num_patches=64", "--native_size",
                               "--features", "--json", *files)
  assert status == 0, err
  grids = [tuple(json.loads(line)["grid"]) for line in out.splitlines()]
  assert grids == [(5, 8), (8, 8), (2, 6)]
  # A square run's images have no budget to read them at their own size.
  status, _, err = call_tool("predict", f"--workdir={digits_run[0]}",
                             "--native_size", *files)
  assert status == 2 and err.strip() == (
      "error: --native_size reads images NaFlex-style: give "
      "--max_num_patches too")


def test_predict_reads_a_packed_runs_images_as_its_evaluation_did(
    packed_run, digits_data_dir, tmp_path):
  """Without --max_num_patches and --native_size, predict reads each image
  as the packed run's evaluation read it, at its own size under the run's
  64 patches: its probabilities are those of the flags given, and those of
  the run's params on the evaluation pipeline's batch of the same images.
  --max_num_patches=0 reads them square instead, which gives others."""
  _, workdir = packed_run
  source = sources.lookup("digits/mixed_sizes", digits_data_dir)
  batch = next(pipeline.eval_dataset(
      source, "test", batch_size=8, image_size=16,
      naflex=naflex.Budget(2, 64, fill=False)).as_numpy_iterator())
  records = source.builder.as_data_source(split="test")
  files = []
  for i in batch["index"]:
    files.append(str(tmp_path / f"{i}.png"))
    tf.io.write_file(files[-1], tf.io.encode_png(records[int(i)]["image"]))
  inference = pretrained.for_inference(workdir)
  evaluated = jax.nn.softmax(inference.model.apply(
      {"params": inference.params}, naflex.inputs_of(batch), train=False))

  def predicted(*given):
    status, out, err = call_tool("predict", f"--workdir={workdir}",
                                 "--top=10", "--json", *given, *files)
    assert status == 0, err
    shown = np.zeros((len(files), 10))
    for row, line in zip(shown, out.splitlines()):
      for top in json.loads(line)["top"]:
        row[top["class"]] = top["probability"]
    return shown

  by_default = predicted()
  np.testing.assert_array_equal(
      by_default, predicted("--max_num_patches=64", "--native_size"))
  np.testing.assert_allclose(by_default, evaluated, rtol=1e-4, atol=1e-6)
  square = predicted("--max_num_patches=0")
  assert np.abs(square - by_default).max() > 0.01
  # And the top class of some (the first, when written).
  assert (square.argmax(1) != by_default.argmax(1)).any()


def test_sampled_resolutions_and_dropped_patches_are_each_images_own(
    digits_data_dir):
  """Resolution sampling and drawn token dropping in the pipeline: each
  image at an area of s x s pixels, s in [8, 12], then a share of at most
  twice token_drop of its patches left out; the same draws on a second
  read."""
  source = sources.lookup("digits/mixed_sizes", digits_data_dir)
  packs = packing.Packing(64, 5, 2.5, min_side=8, max_side=12,
                          token_drop=0.3, token_drop_sampled=True)

  def first_batch():
    return next(pipeline.train_dataset(
        source, "train", batch_size=64, image_size=16, seed=3,
        naflex=naflex.Budget(2, 64, fill=False),
        packing=packs).as_numpy_iterator())

  batch = first_batch()
  assert_trees_equal(first_batch(), batch)
  areas = batch["grid"].prod(axis=1) * 4  # Pixels, rounded up to patches.
  assert areas.min() >= 8 * 8 and np.median(areas) <= 14 * 14
  count = batch["grid"].prod(axis=1)
  dropped = 1 - batch["tokens"] / count
  assert (batch["tokens"] >= 1).all() and dropped.max() <= 0.6
  assert len(set(np.round(dropped, 2))) > 5  # Drawn per image.
  for pixels, positions, tokens, grid in zip(
      batch["image"], batch["positions"], batch["tokens"], batch["grid"]):
    index = positions[:tokens, 0] * grid[1] + positions[:tokens, 1]
    assert np.all(np.diff(index) > 0) and index.max() < grid.prod()
    assert not pixels[tokens:].any()


def test_batches_made_ahead_come_in_order_and_so_do_their_errors():
  def items():
    yield from range(5)
    raise errors.InputError("a broken image")

  got = packing.ahead(items())
  assert [next(got) for _ in range(5)] == list(range(5))
  with pytest.raises(errors.InputError, match="a broken image"):
    next(got)
  # An abandoned one stops its thread.
  endless = packing.ahead(iter(lambda: 0, 1))
  next(endless)
  endless.close()
  for thread in threading.enumerate():
    if thread.name == "packing":
      thread.join(timeout=5)
      assert not thread.is_alive()
