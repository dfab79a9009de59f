"""Evaluators: ReaL and few-shot against hand-made cases and another way of
computing them; the config's list of evaluators and its cadence."""

import json
import os

import jax
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.test_train import compiles_during
from tests.util import mocked_tfds, randomize, run_training, small_config
from vit_jax import sharding
from vit_jax.data import preprocess, sources
from vit_jax.runs import settings
from vit_jax.training import evaluators, resolve, step as step_lib
from vit_jax.training.evaluators import fewshot, real

# --- ReaL ---------------------------------------------------------------------


def test_real_accuracy_of_hand_made_label_sets():
  logits = np.array([[5, 1, 0, 0],    # predicts 0, set {0}: right
                     [0, 1, 2, 0],    # predicts 2, set {1, 2}: right
                     [0, 9, 0, 0],    # predicts 1, empty set: not counted
                     [3, 0, 0, 1],    # predicts 0, set {3}: wrong
                     [0, 0, 1, 4]],   # predicts 3, set {0, 3}: right
                    np.float32)
  sets = [{0}, [1, 2], (), {3}, {0, 3}]
  assert real.accuracy(logits, sets) == 0.75
  # The original label would say 2 of 4 (rows 0 and 4 only, say).
  assert real.accuracy(logits[:2], [[1], [1]]) == 0.0


def test_real_refuses_what_it_cannot_score():
  with pytest.raises(ValueError, match="every label set is empty"):
    real.accuracy(np.zeros((2, 3)), [[], ()])
  with pytest.raises(ValueError, match="2 rows of logits but 1"):
    real.accuracy(np.zeros((2, 3)), [[0]])


# ImageNet ReaL's TFDS features; 21 hand-made validation images of 8x8.
REAL_IMAGES = 21
REAL_SETS = [[], [3], [3, 7], [0], [999], [1, 2, 3]] * 3 + [[5], [], [6]]


@pytest.fixture
def real_validation(tmp_path):
  """A prepared-looking imagenet2012_real whose records are ours."""
  builder = tfds.builder("imagenet2012_real", data_dir=str(tmp_path))
  builder.info.set_splits(tfds.core.SplitDict([tfds.core.SplitInfo(
      name="validation", shard_lengths=[REAL_IMAGES], num_bytes=0,
      filename_template=None)]))
  os.makedirs(builder.data_path, exist_ok=True)
  builder.info.write_to_directory(builder.data_path)
  rng = np.random.default_rng(0)
  images = [tf.io.encode_png(rng.integers(0, 256, (8, 8, 3), np.uint8))
            .numpy() for _ in range(REAL_IMAGES)]

  def records(builder, split, decoders=None, **_):
    del decoders
    # The share of the one-file split asked for (tfds.even_splits).
    [share] = builder.info.splits[split].file_instructions
    start, end = share.skip, share.skip + share.take
    return tf.data.Dataset.from_tensor_slices({
        "image": images[start:end],
        "original_label": np.zeros(end - start, np.int64),
        "real_label": tf.ragged.constant(REAL_SETS[start:end],
                                         dtype=tf.int64, ragged_rank=1)})

  with mocked_tfds(str(tmp_path), records):
    yield str(tmp_path), images


def test_real_evaluator_scores_the_sets_of_every_image(real_validation):
  data_dir, images = real_validation
  # 21 images over 8 shares of 2 or 3, in batches of 16: padded, masked.
  config = small_config(data_dir, batch_size=16, **{
      "evaluators.test.every": 0, "mesh.data": 8, "mesh.model": 1})
  config.evaluators.real = dict(kind="real", every=5)
  mesh = sharding.make_mesh(config.mesh)
  checked = resolve.check_values(settings.of(config))
  built = step_lib.parts(checked.settings, 1000)
  program = step_lib.build(checked.settings, mesh, built)
  params = randomize(program.init(jax.random.key(0)).params, scale=1.0)
  # Predictions among classes 0-7, where the sets are: some right, some not.
  params["head"]["bias"][8:] = -100.0
  resolved = resolved_run(config, mesh, sources.Sources(
      config.dataset, config.data_dir), built)
  got = evaluators.Evaluators(resolved, program).run_all(
      jax.device_put(params, program.state_shardings.params))
  pixels = np.stack([preprocess.eval_resize(preprocess.decode(image), 8)
                     for image in images])
  logits = program.model.apply({"params": params}, pixels, train=False)
  assert got == {"real_accuracy": real.accuracy(logits, REAL_SETS),
                 "real_examples": len(REAL_SETS)}
  assert 0 < got["real_accuracy"] < 1


# --- Few-shot ------------------------------------------------------------------


def lstsq_predict(x_train, y_train, x_test, num_classes, l2_reg):
  """The same problem as one least-squares system: [X 1; sqrt(l2) I 0]
  [W; b] = [T; 0], so the bias is not penalised."""
  n, d = x_train.shape
  targets = 2.0 * np.eye(num_classes)[y_train] - 1.0
  a = np.block([[x_train, np.ones((n, 1))],
                [np.sqrt(l2_reg) * np.eye(d), np.zeros((d, 1))]])
  b = np.concatenate([targets, np.zeros((d, num_classes))])
  solution = np.linalg.lstsq(a, b, rcond=None)[0]
  scores = x_test @ solution[:-1] + solution[-1]
  return np.argmax(scores, axis=-1), scores


@pytest.mark.parametrize("n,d", [(60, 8),    # More examples than features.
                                 (12, 40)])  # Fewer: the n x n form.
@pytest.mark.parametrize("l2_reg", [1e-3, 1.0, 300.0])
def test_fewshot_fit_predict_is_the_closed_form(n, d, l2_reg):
  rng = np.random.default_rng(n + d)
  num_classes = 4
  x_train = rng.standard_normal((n, d)) + 2.0  # Off-centre: the bias matters.
  y_train = np.arange(n) % num_classes
  x_train[np.arange(n), y_train] += 1.5  # Some signal to fit.
  x_test = rng.standard_normal((500, d)) + 2.0
  expected, scores = lstsq_predict(x_train, y_train, x_test, num_classes,
                                   l2_reg)
  # Compare only where the top two scores are not a rounding error apart.
  top2 = np.sort(scores, axis=-1)[:, -2:]
  clear = top2[:, 1] - top2[:, 0] > 1e-9
  assert clear.mean() > 0.95
  got = fewshot.fit_predict(x_train, y_train, x_test, num_classes, l2_reg)
  assert got.shape == (500,)
  np.testing.assert_array_equal(got[clear], expected[clear])
  # One eigendecomposition for many penalties gives each one's answer.
  many = fewshot.fit_predict_all(x_train, y_train, x_test, num_classes,
                                 [l2_reg, 10 * l2_reg])
  np.testing.assert_array_equal(many[0], got)
  np.testing.assert_array_equal(
      many[1], fewshot.fit_predict(x_train, y_train, x_test, num_classes,
                                   10 * l2_reg))


def test_fewshot_separates_separable_classes():
  centres = np.eye(3) * 10
  x_train = np.repeat(centres, 2, axis=0) + 0.1
  y_train = np.repeat(np.arange(3), 2)
  x_test = centres - 0.2
  np.testing.assert_array_equal(
      fewshot.fit_predict(x_train, y_train, x_test, 3, 1e-2), [0, 1, 2])


def resolved_run(config, mesh, data, built, checked=None):
  """The Run of `config` with no workdir: the parts of it that evaluators
  read."""
  checked = checked or resolve.check_values(settings.of(config))
  return resolve.Run(settings=checked.settings,
                     augmentation=checked.augmentation,
                     evaluations=checked.evaluations, workdir=None, mesh=mesh,
                     sources=data, changes={}, parts=built)


def evaluated_run(config, params=None):
  """(the Run of `config`, its program, `params` on its mesh: by default a
  random small model's), checked as a run is."""
  mesh = sharding.make_mesh(config.mesh)
  data = sources.Sources(config.dataset, config.data_dir)
  checked = resolve.check_values(settings.of(config))
  resolve.check_data(checked, data)
  built = step_lib.parts(checked.settings, 10)
  program = step_lib.build(checked.settings, mesh, built)
  if params is None:
    params = randomize(program.init(jax.random.key(0)).params)
  params = jax.device_put(params, program.state_shardings.params)
  return resolved_run(config, mesh, data, built, checked), program, params


def run_evaluators(config, params=None):
  """The config's evaluators at the last step, on a random small model."""
  resolved, program, params = evaluated_run(config, params)
  return program, params, evaluators.Evaluators(resolved, program).run_all(
      params)


def test_fewshot_evaluator_on_digits(digits_data_dir):
  config = small_config(digits_data_dir, **{"evaluators.test.every": 0})
  config.evaluators.fewshot = dict(kind="fewshot", every=5, datasets=dict(
      digits=("train", "test")), shots=(1, 10, 200))
  _, _, metrics = run_evaluators(config)
  # Digits' train split has about 140 of each class: no 200-shot.
  assert set(metrics) == {"fewshot/digits_1shot", "fewshot/digits_10shot"}
  # Features of a random ViT separate digits far above chance (0.1).
  assert metrics["fewshot/digits_10shot"] > 0.25
  assert metrics["fewshot/digits_10shot"] > metrics["fewshot/digits_1shot"]


# --- The list of evaluators ----------------------------------------------------


@pytest.mark.parametrize("entry,message", [
    (dict(kind="top5", every=1), "kind must be one of accuracy, real, "
     "fewshot, knn, loss, zero_shot, retrieval, got 'top5'"),
    (dict(kind="accuracy", every=-1, split="test"), "every must be an "
     "integer >= 0"),
    (dict(kind="accuracy", every=1, splt="test"), "has no setting splt"),
    (dict(kind="accuracy", every=1, split="validation"), "validation"),
    (dict(kind="fewshot", every=1), "needs datasets"),
    (dict(kind="fewshot", every=1, datasets=dict(
        digits=("train", "test"), no_such_set=("train", "test"))),
     "no_such_set"),
    (dict(kind="fewshot", every=1, datasets=dict(digits=("train",))),
     "datasets.digits must be (train split, test split)"),
])
def test_bad_evaluators_fail_clearly_before_compiling(
    digits_data_dir, tmp_path, entry, message):
  config = small_config(digits_data_dir)
  config.evaluators.extra = entry
  compiles, error = compiles_during(
      lambda: run_training(config, str(tmp_path)))
  assert "config.evaluators.extra" in error and message in error
  assert not compiles


def test_each_evaluator_runs_at_its_own_cadence(digits_data_dir, tmp_path):
  config = small_config(digits_data_dir, total_steps=6, log_every=3,
                        checkpoint_every=6,
                        **{"evaluators.test.every": 2})
  config.evaluators.held = dict(kind="accuracy", every=4, split="train[:64]")
  config.evaluators.never = dict(kind="accuracy", every=0, split="x")
  result = run_training(config, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  at = lambda key: [r["step"] for r in rows if key in r]
  assert at("test_accuracy") == [2, 4, 6]
  assert at("held_accuracy") == [4, 6]  # And at the last step.
  assert not any(key.startswith("never") for r in rows for key in r)
  assert {"test_accuracy", "held_accuracy"} <= set(result)
