"""The k-NN evaluator: its vote against a hand computation, its ties and a
k above the training set, its settings' checks, and on digits the accuracy
it logs against its numpy function on features computed apart."""

import jax
import numpy as np
import pytest

from tests.test_evaluators import evaluated_run
from tests.util import small_config, stored_examples
from vit_jax import errors
from vit_jax.data import preprocess, sources
from vit_jax.runs import settings
from vit_jax.training import evaluators, resolve
from vit_jax.training.evaluators import knn

# --- The vote -------------------------------------------------------------------

# Five neighbours: three of class 0 barely similar, two of class 1 close.
# A plain majority says 0; weighted by exp(s / 0.07), 1 wins by far.
SIMILARITY = np.array([[0.1, 0.1, 0.1, 0.5, 0.5]])
LABELS = np.array([[0, 0, 0, 1, 1]])


def hand_vote(similarity, labels, num_classes, temperature):
  votes = np.zeros((len(labels), num_classes))
  for row in range(len(labels)):
    for s, label in zip(similarity[row], labels[row]):
      votes[row, label] += np.exp(s / temperature)
  return votes


def test_the_vote_weighs_each_neighbour_by_its_similarity():
  votes = hand_vote(SIMILARITY, LABELS, 2, 0.07)
  assert votes[0, 1] > 100 * votes[0, 0]  # 2 e^7.1 against 3 e^1.4.
  assert np.bincount(LABELS[0]).argmax() == 0  # The plain majority.
  np.testing.assert_array_equal(knn.vote(SIMILARITY, LABELS, 2, 0.07), [1])
  # A high temperature weighs them nearly alike: the majority again.
  assert hand_vote(SIMILARITY, LABELS, 2, 100.0)[0].argmax() == 0
  np.testing.assert_array_equal(knn.vote(SIMILARITY, LABELS, 2, 100.0), [0])


def test_the_vote_matches_the_hand_computation_on_many_rows():
  rng = np.random.default_rng(0)
  similarity = rng.uniform(-1, 1, (200, 7))
  labels = rng.integers(0, 4, (200, 7))
  for temperature in (0.02, 0.07, 1.0):
    np.testing.assert_array_equal(
        knn.vote(similarity, labels, 4, temperature),
        hand_vote(similarity, labels, 4, temperature).argmax(axis=1))
  # A temperature whose exp(1 / T) overflows float64 still votes.
  np.testing.assert_array_equal(knn.vote(SIMILARITY, LABELS, 2, 1e-3), [1])


def test_predict_votes_by_cosine_similarity_of_the_nearest():
  # The neighbours of the vote above (cosines 0.1 and 0.5 with the test
  # feature e0) and two of class 0 far off, at norms that do not count:
  # by dot product the first (norm 50) would be the nearest.
  def at(cosine, norm):
    return norm * np.array([cosine, np.sqrt(1 - cosine**2), 0.0])

  x_train = np.stack([at(0.1, 50.0), at(-0.9, 1.0), at(0.5, 9.0),
                      at(0.1, 0.2), at(-1.0, 1.0), at(0.5, 0.5),
                      at(0.1, 1.0)])
  y_train = np.array([0, 0, 1, 0, 0, 1, 0])
  x_test = np.array([[4.0, 0.0, 0.0]])
  got = knn.predict(x_train, y_train, x_test, 2, (1, 5, 7), 0.07)
  assert {k: v.tolist() for k, v in got.items()} == {1: [1], 5: [1], 7: [1]}
  # Every one of the 7 by hand: 1, where 5 of 7 say 0.
  hand = hand_vote(np.array([[0.1, -0.9, 0.5, 0.1, -1.0, 0.5, 0.1]]),
                   y_train[None], 2, 0.07)
  assert hand[0].argmax() == 1 and np.bincount(y_train).argmax() == 0


# --- Ties and a large k ---------------------------------------------------------


def test_top_k_ranks_equal_similarities_by_training_order():
  rng = np.random.default_rng(1)
  # Few distinct values: ties at every k's boundary.
  similarity = rng.integers(0, 4, (64, 30)).astype(np.float32)
  for k in (1, 5, 17, 30):
    expected = np.stack([np.lexsort((np.arange(30), -row))[:k]
                         for row in similarity])
    np.testing.assert_array_equal(knn.top_k(similarity, k), expected)


def test_ties_go_to_the_earlier_example_and_then_the_lower_class():
  # Ten copies of one feature, labelled 1, 2, 0, 0, ...: the first k are
  # the k nearest, and equal votes go to the lower class.
  x_train = np.tile([[1.0, 0.0]], (10, 1))
  y_train = np.array([1, 2, 0, 0, 0, 0, 0, 0, 0, 0])
  x_test = np.array([[1.0, 1.0]])
  got = knn.predict(x_train, y_train, x_test, 3, (1, 2, 3, 10), 0.07)
  assert {k: int(v[0]) for k, v in got.items()} == {1: 1, 2: 1, 3: 0, 10: 0}
  # Equal votes (one neighbour each of 1 and 0, equally similar): class 0.
  assert int(knn.vote(np.array([[0.3, 0.3]]), np.array([[1, 0]]), 2,
                      0.07)[0]) == 0


def test_a_k_above_the_training_set_lets_every_example_vote():
  rng = np.random.default_rng(2)
  x_train, y_train = rng.standard_normal((4, 5)), np.array([0, 1, 1, 2])
  x_test = rng.standard_normal((9, 5))
  assert knn.top_k(x_test @ x_train.T, 10).shape == (9, 4)
  got = knn.predict(x_train, y_train, x_test, 3, (4, 10, 1000), 0.07)
  np.testing.assert_array_equal(got[10], got[4])
  np.testing.assert_array_equal(got[1000], got[4])


def test_predict_in_blocks_is_predict_at_once(monkeypatch):
  rng = np.random.default_rng(3)
  x_train, y_train = rng.standard_normal((50, 8)), rng.integers(0, 5, 50)
  x_test = rng.standard_normal((23, 8))
  whole = knn.predict(x_train, y_train, x_test, 5, (1, 7), 0.07)
  # 3 test rows' similarities a block: 8 blocks, the last of 2.
  monkeypatch.setattr(knn, "SIMILARITY_BYTES", 3 * 4 * 50)
  blocks = knn.predict(x_train, y_train, x_test, 5, (1, 7), 0.07)
  for k in (1, 7):
    assert blocks[k].shape == (23,)
    np.testing.assert_array_equal(blocks[k], whole[k])


# --- Settings -------------------------------------------------------------------


@pytest.mark.parametrize("entry,message", [
    (dict(datasets={}), "needs datasets"),
    (dict(ks=(0, 20)), "ks must be integers >= 1"),
    (dict(temperature=0.0), "temperature must be > 0"),
    (dict(train_examples=0), "train_examples must be >= 1"),
    (dict(datasets=dict(digits=("train",))),
     "datasets.digits must be (train split, test split)"),
    (dict(datasets=dict(digits=("train", "nope"))), "nope"),
    (dict(k=5), "has no setting k"),
])
def test_bad_knn_settings_fail_naming_the_key(digits_data_dir, entry, message):
  config = small_config(digits_data_dir)
  entry = {"datasets": dict(digits=("train", "test")), **entry}
  if not entry["datasets"]:
    del entry["datasets"]
  config.evaluators.extra = dict(kind="knn", every=1, **entry)
  with pytest.raises(errors.ConfigError) as raised:
    resolve.check_data(resolve.check_values(settings.of(config)),
                       sources.Sources(config.dataset, config.data_dir))
  assert "config.evaluators.extra" in str(raised.value)
  assert message in str(raised.value)


# --- On digits ------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_knn(digits_data_dir):
  """(the Run, its program, random params on the mesh) of a small digits
  config whose one evaluator is k-NN on digits' train and test splits."""
  config = small_config(digits_data_dir, **{"evaluators.test.every": 0})
  # A temperature off the default's, where 20 votes come out otherwise.
  config.evaluators.knn = dict(kind="knn", every=5, ks=(1, 20),
                               temperature=0.01,
                               datasets=dict(digits=("train", "test")))
  return evaluated_run(config)


def features_apart(run, params, split):
  """(features, labels) of a digits split in file order: decoded, resized
  and through the objective's features outside the evaluator's pipeline,
  batches and mesh."""
  examples = stored_examples(run.sources("digits").builder, split)
  pixels = np.stack([preprocess.eval_resize(
      preprocess.decode(example["image"]), 8).numpy()
                     for example in examples])
  host_params = jax.tree.map(np.asarray, params)
  features = jax.jit(run.parts.objective.features)(host_params, pixels)
  return (np.asarray(features),
          np.array([example["label"] for example in examples]))


def test_knn_evaluator_logs_the_accuracy_of_its_numpy_function(digits_knn):
  run, program, params = digits_knn
  logged = evaluators.Evaluators(run, program).run_all(params)
  assert set(logged) == {"knn/digits_1nn", "knn/digits_20nn"}
  x_train, y_train = features_apart(run, params, "train")
  x_test, y_test = features_apart(run, params, "test")
  assert (len(x_train), len(x_test)) == (1437, 360)
  predictions = knn.predict(x_train, y_train, x_test, 10, (1, 20), 0.01)
  for k in (1, 20):
    assert logged[f"knn/digits_{k}nn"] == np.mean(predictions[k] == y_test)
  # Each number tells its settings: k, and the temperature at 20.
  assert logged["knn/digits_1nn"] != logged["knn/digits_20nn"]
  default = knn.predict(x_train, y_train, x_test, 10, (20,), 0.07)[20]
  assert logged["knn/digits_20nn"] != np.mean(default == y_test)
  # Features of a random ViT find digits' neighbours far above chance.
  assert logged["knn/digits_1nn"] > 0.3


def test_train_examples_caps_what_is_read(digits_knn, monkeypatch):
  run, program, params = digits_knn
  _, _, capped = evaluators.settings("knn", dict(
      run.evaluations[0].settings.to_dict(), kind="knn", every=1,
      train_examples=100))
  evaluator = knn.KNN("knn", capped, run, program)
  calls, voted = [], []
  features = evaluator.features
  evaluator.features = lambda *args: calls.append(1) or features(*args)
  predict = knn.predict
  monkeypatch.setattr(knn, "predict", lambda *args: voted.append(args) or
                      predict(*args))
  evaluator(params)
  [(x, y, *_)] = voted
  assert x.shape[0] == y.shape[0] == 100
  # Batches of 32: ceil(100 / 32) of train, not all 45, then test's 12
  # (90 images a share, 8 a batch).
  assert len(calls) == 4 + 12
  # Rows of the whole split's features, with their own labels.
  x_all, y_all = features_apart(run, params, "train")
  nearest = np.argmin(((x[:, None] - x_all[None]) ** 2).sum(-1), axis=1)
  np.testing.assert_allclose(x, x_all[nearest], rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(y, y_all[nearest])
