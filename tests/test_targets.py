"""Targets and losses: label smoothing, softmax and sigmoid cross-entropy,
Mixup and CutMix, checked against values worked out by hand; today's step
unchanged when they are off."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.util import check_config, program_of, randomize, small_config
from vit_jax import errors, sharding
from vit_jax.runs import settings
from vit_jax.training import losses, step as step_lib, targets
from vit_jax.training.evaluators import accuracy

LOGITS = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], np.float32)


def test_softmax_cross_entropy_by_hand():
  # Row 0, label 0: -log(e^2 / (e^2 + 1 + e^-1)).
  row0 = -(2.0 - math.log(math.exp(2) + 1 + math.exp(-1)))
  row1 = -(3.0 - math.log(2 * math.exp(0.5) + math.exp(3)))
  np.testing.assert_allclose(
      losses.cross_entropy("softmax", LOGITS, np.array([0, 2])),
      [row0, row1], rtol=1e-6)
  # Soft targets: the weighted sum of the classes' -log p.
  soft = np.array([[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]], np.float32)
  log_z0 = math.log(math.exp(2) + 1 + math.exp(-1))
  log_z1 = math.log(2 * math.exp(0.5) + math.exp(3))
  expected = [0.5 * (log_z0 - 2) + 0.5 * (log_z0 - 0),
              0.25 * (log_z1 - 0.5) + 0.75 * (log_z1 - 3)]
  np.testing.assert_allclose(losses.cross_entropy("softmax", LOGITS, soft),
                             expected, rtol=1e-6)


def test_sigmoid_cross_entropy_by_hand():
  def bce(z, t):  # One class's binary cross-entropy.
    p = 1 / (1 + math.exp(-z))
    return -(t * math.log(p) + (1 - t) * math.log(1 - p))

  labels = np.array([0, 2])
  expected = [bce(2, 1) + bce(0, 0) + bce(-1, 0),
              bce(0.5, 0) + bce(0.5, 0) + bce(3, 1)]
  np.testing.assert_allclose(losses.cross_entropy("sigmoid", LOGITS, labels),
                             expected, rtol=1e-6)
  # Multi-hot rows: every class its own problem, summed.
  multi = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
  expected = [bce(2, 1) + bce(0, 1) + bce(-1, 0),
              bce(0.5, 0) + bce(0.5, 0) + bce(3, 0)]
  np.testing.assert_allclose(losses.cross_entropy("sigmoid", LOGITS, multi),
                             expected, rtol=1e-6)


def test_label_smoothing_by_hand_and_rows_sum_to_one():
  smoothed = targets.smooth(jnp.array([2, 0]), 4, 0.1)
  np.testing.assert_allclose(smoothed, [[0.025, 0.025, 0.925, 0.025],
                                        [0.925, 0.025, 0.025, 0.025]],
                             rtol=1e-6)
  np.testing.assert_allclose(smoothed.sum(axis=1), 1, rtol=1e-6)
  # The loss with smoothed targets, by hand: 0.9 of the label's -log p and
  # 0.1 of the mean over the classes.
  loss = losses.cross_entropy("softmax", LOGITS[:1],
                              targets.smooth(jnp.array([0]), 3, 0.1))
  log_z = math.log(math.exp(2) + 1 + math.exp(-1))
  log_p = [2 - log_z, 0 - log_z, -1 - log_z]
  expected = -(0.9 + 0.1 / 3) * log_p[0] - 0.1 / 3 * (log_p[1] + log_p[2])
  np.testing.assert_allclose(loss, [expected], rtol=1e-6)


def constant_images(values, size=4):
  """uint8 images [n, size, size, 3], image i filled with values[i]."""
  return jnp.broadcast_to(jnp.array(values, jnp.uint8)[:, None, None, None],
                          (len(values), size, size, 3))


def test_mixup_mixes_images_and_targets_by_one_ratio():
  recipe = targets.Recipe(num_classes=4, mixup_prob=1.0, mixup_alpha=0.2,
                          groups=2)
  images = constant_images([0, 51, 102, 153, 204, 255, 25, 76])
  labels = jnp.array([0, 1, 2, 3, 0, 1, 2, 3])
  mixed, soft = recipe(images, labels, jax.random.key(3))
  again, soft_again = recipe(images, labels, jax.random.key(3))
  np.testing.assert_array_equal(mixed, again)  # Keyed: deterministic.
  np.testing.assert_array_equal(soft, soft_again)
  np.testing.assert_allclose(soft.sum(axis=1), 1, rtol=1e-6)
  # Partners: the next row within each block of four, the last the first.
  partner = np.array([1, 2, 3, 0, 5, 6, 7, 4])
  ratio = float(soft[0, 0])  # Row 0 is label 0 mixed with label 1.
  assert 0 < ratio < 1
  unit = np.asarray(images, np.float32) / 127.5 - 1
  np.testing.assert_allclose(mixed, ratio * unit + (1 - ratio) * unit[partner],
                             atol=1e-6)
  onehot = np.eye(4)[np.asarray(labels)]
  np.testing.assert_allclose(soft,
                             ratio * onehot + (1 - ratio) * onehot[partner],
                             atol=1e-6)
  _, other = recipe(images, labels, jax.random.key(4))
  assert not np.array_equal(other, soft)  # Another step, another ratio.


def test_cutmix_pastes_a_box_and_weighs_targets_by_its_area():
  recipe = targets.Recipe(num_classes=2, cutmix_prob=1.0, cutmix_alpha=1.0)
  images = constant_images([0, 255], size=16)
  labels = jnp.array([0, 1])
  for seed in range(5):
    mixed, soft = recipe(images, labels, jax.random.key(seed))
    # Image 0 (all -1) keeps its own pixels outside the box, takes image
    # 1's (all +1) inside: the same box in both images.
    from_partner = np.asarray(mixed[0, :, :, 0]) == 1.0
    assert np.all(np.asarray(mixed[1, :, :, 0])[from_partner] == -1.0)
    assert set(np.unique(mixed)) <= {-1.0, 1.0}
    kept = 1 - from_partner.mean()
    np.testing.assert_allclose(soft[0], [kept, 1 - kept], atol=1e-6)
    np.testing.assert_allclose(soft[1], [1 - kept, kept], atol=1e-6)
    if 0 < kept < 1:  # A box: rows and columns of one rectangle.
      rows, cols = np.nonzero(from_partner)
      assert from_partner.sum() == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)


def test_random_erasing_puts_noise_in_one_box_per_image_keyed_by_row():
  """timm's RandomErasing, mode "pixel": a box of 2%-33% of the image and
  aspect 0.3-3.3 replaced by N(0, 1) noise; each row's draw its own, the
  labels as they were."""
  recipe = targets.Recipe(num_classes=2, erasing_prob=1.0)
  images = constant_images([0] * 64, size=16)  # All -1.
  labels = jnp.zeros(64, jnp.int32)
  erased, kept_labels = recipe(images, labels, jax.random.key(0))
  np.testing.assert_array_equal(kept_labels, labels)
  changed = np.asarray(erased != -1.0).any(axis=-1)
  for row in changed:
    rows, cols = np.nonzero(row)
    box = (np.ptp(rows) + 1) * (np.ptp(cols) + 1)
    assert row.sum() == box  # One rectangle.
    assert 0.02 * 256 - 8 < box < 256 / 3 + 8  # Rounding of the sides.
    assert 0.3 / 2 < (np.ptp(rows) + 1) / (np.ptp(cols) + 1) < 2 / 0.3
  noise = np.asarray(erased)[np.broadcast_to(changed[..., None],
                                             erased.shape)]
  assert abs(noise.mean()) < 0.1 and abs(noise.std() - 1) < 0.1
  # A row's draw does not depend on the rows after it.
  first, _ = recipe(images[:8], labels[:8], jax.random.key(0))
  np.testing.assert_array_equal(first, erased[:8])
  # At 0.25, about a quarter of the images.
  quarter, _ = targets.Recipe(num_classes=2, erasing_prob=0.25)(
      images, labels, jax.random.key(1))
  assert 8 <= np.asarray(quarter != -1.0).any(axis=(1, 2, 3)).sum() <= 24


def test_one_draw_picks_mixup_cutmix_or_neither():
  recipe = targets.Recipe(num_classes=2, mixup_prob=0.3, mixup_alpha=1.0,
                          cutmix_prob=0.3, cutmix_alpha=1.0)
  images = constant_images([0, 255], size=8)
  labels = jnp.array([0, 1])
  kinds = []
  for seed in range(200):
    mixed, soft = recipe(images, labels, jax.random.key(seed))
    values = set(np.unique(np.asarray(mixed)).tolist())
    if float(soft[0, 0]) == 1.0:
      kinds.append("none")
      np.testing.assert_array_equal(mixed, np.asarray(images) / 127.5 - 1)
    elif values <= {-1.0, 1.0}:
      kinds.append("cutmix")
    else:
      kinds.append("mixup")
  counts = {kind: kinds.count(kind) for kind in ("none", "mixup", "cutmix")}
  # 0.4 / 0.3 / 0.3 of 200 draws; a cutmix box can come out empty, which
  # counts as none.
  assert 50 <= counts["mixup"] <= 80, counts
  assert 40 <= counts["cutmix"] <= 80, counts
  assert 60 <= counts["none"] <= 110, counts


def test_softmax_with_one_hot_rows_is_the_integer_loss():
  labels = jnp.array([1, 0])
  np.testing.assert_allclose(
      losses.cross_entropy("softmax", LOGITS, targets.smooth(labels, 3, 0.0)),
      losses.cross_entropy("softmax", LOGITS, labels), rtol=1e-6)


def test_defaults_give_todays_step_bitwise(digits_data_dir):
  """Mixup and CutMix at probability 0, no smoothing, softmax: the step is
  today's, computed here from its parts (integer-label cross-entropy)."""
  config = small_config(digits_data_dir, **{
      "mixup.prob": 0.0, "cutmix.prob": 0.0, "label_smoothing": 0.0,
      "loss": "softmax", "mesh.data": 1, "mesh.model": 1})
  assert not targets.Recipe.of(settings.of(config), 10).soft
  mesh = sharding.make_mesh(config.mesh, devices=jax.devices()[:1])
  program = program_of(config, mesh=mesh)
  tx, _ = step_lib.optimizer.create(settings.of(config).optimizer,
                                    config.total_steps)
  rng = np.random.default_rng(0)
  batch = {"image": rng.integers(0, 256, (32, 8, 8, 3), dtype=np.uint8),
           "label": rng.integers(0, 10, 32).astype(np.int32),
           "mask": np.ones(32, np.float32)}

  @jax.jit
  def todays_step(state, batch):
    key = jax.random.fold_in(jax.random.key(config.seed), state.step)

    def loss(params):
      logits = program.model.apply({"params": params}, batch["image"],
                                   train=True, rngs={"dropout": key})
      weights = batch["mask"] / batch["mask"].sum()
      return (weights * optax.softmax_cross_entropy_with_integer_labels(
          logits, batch["label"])).sum()

    value, grads = jax.value_and_grad(loss)(state.params)
    updates, _ = tx.update(grads, state.opt_state, state.params)
    return value, optax.apply_updates(state.params, updates)

  state = program.init(jax.random.key(0))
  expected_loss, expected = todays_step(state, batch)
  state, metrics = program.train_step(state, batch)
  assert float(metrics["train_loss"]) == float(expected_loss)
  jax.tree.map(np.testing.assert_array_equal, state.params, expected)


@pytest.mark.parametrize("accum_steps", [1, 2])
def test_a_masked_row_adds_nothing_to_the_loss_or_the_gradients(
    digits_data_dir, accum_steps):
  """A row of mask 0 (a record whose image did not decode,
  vit_jax/data/broken_records.py) weighs nothing: whatever its image and
  label, the step's loss and gradients are the mean over the other rows,
  with or without micro-batches. Plain SGD at rate 1 (the schedule's first
  step) makes a step's update the gradient itself; no dropout, so that a
  batch of the other rows alone draws nothing differently."""
  config = small_config(digits_data_dir, accum_steps=accum_steps, **{
      "model.dropout_rate": 0.0, "optimizer.name": "sgd",
      "optimizer.momentum": 0.0, "optimizer.learning_rate": 1.0,
      "optimizer.warmup_steps": 0, "optimizer.decay": "linear",
      "optimizer.weight_decay": 0.0, "optimizer.grad_clip_norm": 0.0})
  program = program_of(config)
  rng = np.random.default_rng(0)
  batch = {"image": rng.integers(0, 256, (32, 8, 8, 3), dtype=np.uint8),
           "label": rng.integers(0, 10, 32).astype(np.int32),
           "mask": np.ones(32, np.float32)}
  batch["mask"][::4] = 0  # 8 rows masked, in each micro-batch and shard.
  kept = batch["mask"] == 1

  # Random weights: a fresh init's zero head gives every image the same
  # loss, log(10), whatever its pixels and label.
  start = randomize(jax.device_get(program.init(jax.random.key(0)).params))

  def step(batch):
    """(loss, grad norm, gradients) of one step from `start`."""
    state = program.init(jax.random.key(0))  # Donated by each step.
    state = state.replace(params=jax.device_put(
        start, program.state_shardings.params))
    state, metrics = program.train_step(
        state, jax.device_put(batch, program.batch_sharding))
    grads = jax.tree.map(np.subtract, start, jax.device_get(state.params))
    return float(metrics["train_loss"]), float(metrics["grad_norm"]), grads

  loss, grad_norm, grads = step(batch)
  # The masked rows' images and labels changed: not a bit of it moves.
  changed = {**batch, "image": batch["image"].copy(),
             "label": batch["label"].copy()}
  changed["image"][~kept] = 255 - changed["image"][~kept]
  changed["label"][~kept] = (changed["label"][~kept] + 5) % 10
  changed_loss, changed_norm, changed_grads = step(changed)
  assert (changed_loss, changed_norm) == (loss, grad_norm)
  jax.tree.map(np.testing.assert_array_equal, changed_grads, grads)
  # The mean over the 24 other rows, as a batch of their own computes it.
  alone = {key: value[kept] for key, value in batch.items()}
  alone_loss, alone_norm, alone_grads = step(alone)
  assert loss == pytest.approx(alone_loss, rel=1e-5)
  assert grad_norm == pytest.approx(alone_norm, rel=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3,
                                                       atol=1e-6),
               grads, alone_grads)
  # Those rows do count when unmasked: the comparisons above are not empty.
  unmasked = {**changed, "mask": np.ones(32, np.float32)}
  assert step(unmasked)[0] != pytest.approx(loss, rel=1e-3)
  # A batch masked whole (every record broken) trains nothing.
  nothing = {**batch, "mask": np.zeros(32, np.float32)}
  none_loss, none_norm, none_grads = step(nothing)
  assert (none_loss, none_norm) == (0.0, 0.0)
  assert not any(np.any(g) for g in jax.tree.leaves(none_grads))


@pytest.mark.parametrize("overrides, message", [
    ({"loss": "hinge"}, "config.loss"),
    ({"label_smoothing": 1.0}, "config.label_smoothing"),
    ({"mixup.prob": 1.5}, "config.mixup.prob"),
    ({"cutmix.prob": 0.5, "cutmix.alpha": 0.0}, "config.cutmix.alpha"),
    ({"mixup.prob": 0.6, "cutmix.prob": 0.6}, "at most 1"),
    ({"randaugment": "2"}, "randaugment"),
    ({"randaugment": "2,11"}, "randaugment"),
    ({"random_erasing": 0.25, "naflex.max_num_patches": 16},
     "config.random_erasing"),
])
def test_bad_settings_are_refused_by_name(digits_data_dir, overrides,
                                          message):
  with pytest.raises(errors.ConfigError, match=message):
    check_config(small_config(digits_data_dir, **overrides))


def test_multi_label_accuracy_by_hand():
  """The top class counts as right when it is any of an example's classes,
  the first or another; masked rows count for nothing."""
  logits = np.array([[0, 1, 5, 0],    # top 2, classes {0, 2}: right
                     [4, 1, 0, 0],    # top 0, classes {1, 3}: wrong
                     [0, 0, 1, 2],    # top 3, classes {3}: right
                     [0, 9, 0, 0],    # top 1, classes {1}: masked
                     [0, 3, 0, 0]],   # top 1, no class: wrong
                    np.float32)
  multi_hot = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 0, 1],
                        [0, 1, 0, 0], [0, 0, 0, 0]], np.float32)
  mask = np.array([1, 1, 1, 0, 1], np.float32)
  got = accuracy.counts(logits, {"label": multi_hot, "mask": mask})
  assert (int(got["correct"]), int(got["count"])) == (2, 4)  # 0.5.
  # Integer labels, the first of each set: row 0's top is not label 0.
  got = accuracy.counts(logits, {"label": np.array([0, 1, 3, 1, 0]),
                                 "mask": mask})
  assert (int(got["correct"]), int(got["count"])) == (1, 4)


def test_a_multi_label_dataset_trains_with_the_sigmoid_loss(tmp_path):
  """TFDS voc/2007's "labels" is a set of classes: its examples' labels
  are multi-hot rows, the sigmoid loss trains on them and accuracy counts
  a top class that is one of an image's. (Random examples served as the
  metadata's splits say, tests/util.py's mocked_tfds.)"""
  import os  # pylint: disable=g-import-not-at-top

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  from tests.test_table2 import _split_dict  # pylint: disable=g-import-not-at-top
  from tests.util import (  # pylint: disable=g-import-not-at-top
    latest_checkpoint,
    mocked_tfds,
    run_training,
  )
  from vit_jax.data import preprocess, sources  # pylint: disable=g-import-not-at-top

  data_dir = str(tmp_path / "data")
  builder = tfds.builder("voc/2007", data_dir=data_dir)
  builder.info.set_splits(_split_dict({"train": 64, "test": 32}))
  os.makedirs(builder.data_path)
  builder.info.write_to_directory(builder.data_path)

  def records(builder, split, **_):
    del builder, split
    rng = np.random.default_rng(0)
    images = [tf.io.encode_png(rng.integers(0, 256, (8, 8, 3),
                                            dtype=np.uint8)).numpy()
              for _ in range(16)]
    labels = [[i % 20, (i + 3) % 20] for i in range(16)]
    return tf.data.Dataset.from_tensor_slices({"image": images,
                                               "labels": labels})

  with mocked_tfds(data_dir, records):
    source = sources.lookup("voc/2007", data_dir)
    assert source.multi_label and source.num_classes == 20
    row = source.label({"labels": tf.constant([3, 5, 3])})
    np.testing.assert_array_equal(row, np.isin(np.arange(20), [3, 5]))
    config = small_config(data_dir, dataset="voc/2007", loss="sigmoid",
                          **{"evaluators.test.split": "test"})
    with pytest.raises(errors.ConfigError, match="loss='sigmoid'"):
      check_config(small_config(data_dir, dataset="voc/2007"))
    result = run_training(config, str(tmp_path / "run"))
    served = list(records(None, None).as_numpy_iterator())
  assert np.isfinite(result["train_loss"])
  # The evaluator's accuracy, worked out again from the final weights: the
  # share of the test examples whose top class is one of theirs. The split's
  # 32 are read in an input share per data-parallel device (4), each served
  # the same 16 records, of which it takes its 8: the first 8, 4 times.
  assert result["test_examples"] == 32
  served = served[:32 // config.mesh.data]
  _, params, _ = latest_checkpoint(str(tmp_path / "run"), config,
                                   num_classes=20)
  pixels = np.stack([preprocess.eval_resize(preprocess.decode(e["image"]), 8)
                     for e in served])
  top = np.argmax(program_of(config, 20).model.apply(
      {"params": params}, pixels, train=False), axis=-1)
  right = [t in e["labels"] for t, e in zip(top, served)]
  assert result["test_accuracy"] == pytest.approx(np.mean(right), abs=1e-6)
