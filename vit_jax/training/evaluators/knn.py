"""k-nearest-neighbour classification of frozen features, as DINO and
DINOv2 evaluate them (Caron et al. 2021; dinov2/eval/knn.py).

Features (the objective's `features`) are L2-normalised. Each test example
takes the k training examples of highest cosine similarity; each votes for
its class with weight exp(similarity / temperature), and the class of the
largest summed vote is the prediction. Ties are settled one way, so that
an evaluation is a function of its features alone: among equally similar
training examples the earlier one (in the order read) is the nearer, and
among equal votes the lower class wins. A k above the training examples
read lets every one of them vote.

Settings (config.evaluators.NAME): datasets, a dict of TFDS name ->
(train split, test split); ks, the k of each score (DINOv2 reports 10, 20,
100 and 200); temperature; train_examples, how many training examples at
most are read (the first in the order the evaluation batches bring them:
the front of each data-parallel share, so which ones depends on the mesh;
slice the split, "train[:50000]", for a set that does not). Logs
NAME/<dataset>_<k>nn, the test accuracy with k neighbours, for each k.

The neighbours are found on the host, in numpy float32, a block of test
rows at a time against every training feature: the features reach every
process whole anyway (batches.jit), the only compiled program stays the
features', and a block's similarities stay near SIMILARITY_BYTES however
large the training set. The cost is test x train x width multiply-adds
on the host's CPUs: 4 x 10^12 for ImageNet's 50k validation images
against 100k training images at width 768, 13 times that against the
whole training split (DINOv2's protocol), where a device would be the
faster place.
"""

import numpy as np
from absl import logging

from vit_jax import errors
from vit_jax.training.evaluators import batches

# Host memory: 100k features of width 1024 in float32 are 400 MB.
DEFAULTS = dict(datasets={}, ks=(20,), temperature=0.07,
                train_examples=100_000)

SIMILARITY_BYTES = 64 * 2**20  # A block of test rows' similarities.


def normalize(x):
  """Rows of x over their L2 norm, float32; a zero row stays zero."""
  x = np.asarray(x, np.float32)
  norms = np.linalg.norm(x, axis=-1, keepdims=True)
  return x / np.maximum(norms, 1e-12)


def top_k(similarity, k):
  """Column indices [rows, min(k, columns)] of each row's largest values,
  largest first; among equal values the lower column first."""
  k = min(k, similarity.shape[1])
  top = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
  values = np.take_along_axis(similarity, top, axis=1)
  # argpartition picks among values equal to the k-th as it likes: a row
  # where it left one out is ranked whole, stably (rare: exact ties).
  kth = values.min(axis=1, keepdims=True)
  cut = (similarity == kth).sum(axis=1) > (values == kth).sum(axis=1)
  for row in np.flatnonzero(cut):
    top[row] = np.argsort(-similarity[row], kind="stable")[:k]
  values = np.take_along_axis(similarity, top, axis=1)
  return np.take_along_axis(top, np.lexsort((top, -values), axis=1), axis=1)


def vote(similarity, labels, num_classes, temperature):
  """The class of each row's largest sum of exp(similarity / temperature)
  over its neighbours (similarity, labels: [rows, k]); ties to the lower
  class."""
  similarity = np.asarray(similarity, np.float64)
  # Less each row's largest: the same argmax (a factor per row), and no
  # overflow at a small temperature (DINOv2 takes the softmax).
  weights = np.exp((similarity - similarity.max(axis=1, keepdims=True))
                   / temperature)
  rows = np.arange(len(labels))[:, None] * num_classes
  votes = np.bincount((rows + labels).ravel(), weights.ravel(),
                      minlength=len(labels) * num_classes)
  return np.argmax(votes.reshape(len(labels), num_classes), axis=1)


def predict(x_train, y_train, x_test, num_classes, ks, temperature):
  """{k: the predicted class of each row of x_test} for each of ks, from
  the k rows of x_train of highest cosine similarity."""
  if not len(x_train):
    raise ValueError("k-NN needs at least one training example")
  train, test = normalize(x_train), normalize(x_test)
  y_train = np.asarray(y_train)
  block = max(1, SIMILARITY_BYTES // (4 * len(train)))
  predictions = {k: [] for k in ks}
  for start in range(0, len(test), block):
    similarity = test[start:start + block] @ train.T
    # The k nearest of every k are the front of the largest k's, as the
    # order is total (ties to the earlier example).
    nearest = top_k(similarity, max(ks))
    nearest_similarity = np.take_along_axis(similarity, nearest, axis=1)
    for k in ks:
      predictions[k].append(vote(nearest_similarity[:, :k],
                                 y_train[nearest[:, :k]], num_classes,
                                 temperature))
  return {k: (np.concatenate(rows) if rows else np.zeros(0, np.int64))
          for k, rows in predictions.items()}


class KNN(batches.FeatureEvaluator):

  kind = "knn"

  @classmethod
  def check(cls, settings, data):
    cls.check_datasets(settings, data)
    if not settings.ks or min(settings.ks) < 1:
      raise errors.InputError(
          f"knn ks must be integers >= 1, got {settings.ks!r}")
    if not settings.temperature > 0:
      raise errors.InputError(
          f"knn temperature must be > 0, got {settings.temperature!r}")
    if settings.train_examples < 1:
      raise errors.InputError(f"knn train_examples must be >= 1, got "
                              f"{settings.train_examples!r}")

  def __call__(self, params):
    metrics = {}
    for dataset, (train_split, test_split) in self.settings.datasets.items():
      for k, accuracy in self.evaluate(params, dataset, train_split,
                                       test_split).items():
        metrics[f"{self.name}/{dataset}_{k}nn"] = accuracy
    return metrics

  def evaluate(self, params, dataset, train_split, test_split):
    """{k: test accuracy} for every k of the settings."""
    x_train, y_train = self.collect(params, dataset, train_split,
                                    self.settings.train_examples)
    x_test, y_test = self.collect(params, dataset, test_split)
    if max(self.settings.ks) > len(x_train):
      logging.warning("knn %s: %s has %d examples, fewer than k=%d: all of "
                      "them vote", self.name, train_split, len(x_train),
                      max(self.settings.ks))
    predictions = predict(x_train, y_train, x_test,
                          self.run.sources(dataset).num_classes,
                          self.settings.ks, self.settings.temperature)
    return {k: float(np.mean(predicted == y_test))
            for k, predicted in predictions.items()}
