"""Few-shot linear evaluation (Section 4.1) of frozen features.

A linear classifier is fitted in closed form (regularised least squares to
{-1, 1}^K targets) on k examples per class of a dataset's training split,
from the model's pre-logits features (what its head reads), and scored on
the test split. The L2 penalty is chosen per k on held-out examples of the
training split, disjoint from every k-shot set.

Settings (config.evaluators.NAME): datasets, a dict of TFDS name ->
(split the shots and held-out examples come from, test split); shots;
l2_regs; heldout_per_class. Logs NAME/<dataset>_<k>shot.
"""

import numpy as np
from absl import logging

from vit_jax import errors
from vit_jax.training.evaluators import batches

DEFAULTS = dict(
    datasets={}, shots=(1, 5, 10, 25),
    # A wide grid costs little: one eigendecomposition serves every value.
    l2_regs=tuple(2.0**i for i in range(-10, 20)),
    heldout_per_class=5)

def fit_predict(x_train, y_train, x_test, num_classes, l2_reg):
  """Labels of x_test predicted by the linear map (with a bias) that
  minimises ||x_train W + b - T||^2 + l2_reg ||W||^2, where row i of T is
  +1 at class y_train[i] and -1 elsewhere."""
  return fit_predict_all(x_train, y_train, x_test, num_classes, [l2_reg])[0]


def fit_predict_all(x_train, y_train, x_test, num_classes, l2_regs):
  """fit_predict for each of l2_regs, from one eigendecomposition."""
  x = np.asarray(x_train, np.float64)
  targets = 2.0 * np.eye(num_classes)[np.asarray(y_train)] - 1.0
  # The bias is not penalised: centring x and T takes it out of the problem.
  x_mean, t_mean = x.mean(axis=0), targets.mean(axis=0)
  x, targets = x - x_mean, targets - t_mean
  test = np.asarray(x_test, np.float64) - x_mean
  if len(x) >= x.shape[1]:  # W = (X'X + l2 I)^-1 X'T, a d x d system.
    eigenvalues, vectors = np.linalg.eigh(x.T @ x)
    rotated = vectors.T @ (x.T @ targets)
    weights = [vectors @ (rotated / (eigenvalues + l2)[:, None])
               for l2 in l2_regs]
  else:  # Fewer examples than features: W = X'(XX' + l2 I)^-1 T, n x n.
    eigenvalues, vectors = np.linalg.eigh(x @ x.T)
    rotated = vectors.T @ targets
    weights = [x.T @ (vectors @ (rotated / (eigenvalues + l2)[:, None]))
               for l2 in l2_regs]
  return [np.argmax(test @ w + t_mean, axis=-1) for w in weights]


class FewShot(batches.FeatureEvaluator):

  kind = "fewshot"

  @classmethod
  def check(cls, settings, data):
    cls.check_datasets(settings, data)
    if min(settings.shots) < 1 or settings.heldout_per_class < 1:
      raise errors.InputError(
          "fewshot shots and heldout_per_class must be >= 1")

  def __call__(self, params):
    metrics = {}
    for dataset, (pool_split, test_split) in self.settings.datasets.items():
      for shots, accuracy in self.evaluate(params, dataset, pool_split,
                                           test_split).items():
        metrics[f"{self.name}/{dataset}_{shots}shot"] = accuracy
    return metrics

  def evaluate(self, params, dataset, pool_split, test_split):
    """{k: test accuracy} for every k the training split can provide."""
    num_classes = self.run.sources(dataset).num_classes
    heldout = self.settings.heldout_per_class
    per_class = self.pool(params, dataset, pool_split, num_classes,
                          max(self.settings.shots) + heldout)
    x_test, y_test = self.collect(params, dataset, test_split)
    results = {}
    for shots in sorted(self.settings.shots):
      fewest = min(len(rows) for rows in per_class)
      if fewest < shots + heldout:
        logging.warning(
            "few-shot %s: skipping %d-shot; a class of %s has only %d "
            "examples, and %d-shot needs %d plus %d held out", self.name,
            shots, pool_split, fewest, shots, shots, heldout)
        continue
      # Shots from the front of each class's examples, held-out ones from
      # the back: disjoint for every k.
      x_fit = np.concatenate([rows[:shots] for rows in per_class])
      y_fit = np.repeat(np.arange(num_classes), shots)
      x_held = np.concatenate([rows[-heldout:] for rows in per_class])
      y_held = np.repeat(np.arange(num_classes), heldout)
      predictions = fit_predict_all(
          x_fit, y_fit, np.concatenate([x_held, x_test]), num_classes,
          self.settings.l2_regs)
      scores = [np.mean(p[:len(x_held)] == y_held) for p in predictions]
      best = int(np.argmax(scores))  # The first of equals: the smallest l2.
      results[shots] = float(np.mean(predictions[best][len(x_held):]
                                     == y_test))
    return results

  def pool(self, params, dataset, split, num_classes, wanted):
    """Features of the first `wanted` examples of each class of `split`, in
    the (deterministic) order the evaluation batches bring them; reading
    stops once every class has them."""
    per_class = [[] for _ in range(num_classes)]
    for batch in self.split_batches(dataset, split):
      out = self.features(params, batch)
      for feature, label, mask in zip(np.asarray(out["features"]),
                                      np.asarray(out["label"]),
                                      np.asarray(out["mask"])):
        if mask and len(per_class[label]) < wanted:
          per_class[label].append(feature)
      # Every process sees the same replicated labels, so all stop at the
      # same batch and their collectives stay in step.
      if all(len(rows) == wanted for rows in per_class):
        break
    return [np.stack(rows) if rows else np.zeros((0, 0)) for rows in
            per_class]
