"""Evaluators: what a run measures on held-out data.

config.evaluators maps a name to one evaluator's settings:

  kind   "accuracy" (accuracy.py), "real" (real.py), "fewshot" (fewshot.py),
         "knn" (knn.py: k-nearest-neighbour votes of frozen features),
         "loss" (loss.py: the objective's loss on held-out data),
         "zero_shot" (zero_shot.py: a two-tower model's classes from
         their names) or "retrieval" (retrieval.py: its recall of
         texts from images and images from texts)
  every  evaluate every N steps and at the last step; 0: never
  ...    the kind's own settings (its DEFAULTS), which the name prefixes
         in what it logs: "test" -> test_accuracy, "fewshot" ->
         fewshot/cifar10_5shot, "knn" -> knn/cifar10_20nn.

A run parses them once (`enabled`, in training/resolve.py), `check`
refuses what its data cannot give before anything is compiled, and the
loop calls `run_due` once per step.
"""

from typing import NamedTuple

import ml_collections

from vit_jax import errors
from vit_jax.training import reporting
from vit_jax.training.evaluators import (
  accuracy,
  fewshot,
  knn,
  loss,
  real,
  retrieval,
  zero_shot,
)

KINDS = {"accuracy": (accuracy.Accuracy, accuracy.DEFAULTS),
         "real": (real.Real, real.DEFAULTS),
         "fewshot": (fewshot.FewShot, fewshot.DEFAULTS),
         "knn": (knn.KNN, knn.DEFAULTS),
         "loss": (loss.HeldOutLoss, loss.DEFAULTS),
         "zero_shot": (zero_shot.ZeroShot, zero_shot.DEFAULTS),
         "retrieval": (retrieval.Retrieval, retrieval.DEFAULTS)}


class Evaluation(NamedTuple):
  """One evaluator that a run runs."""
  name: str  # what prefixes its metrics
  kind: str  # a key of KINDS
  every: int  # steps between evaluations (and at the last step)
  settings: ml_collections.FrozenConfigDict  # its kind's defaults, then the
  #                                            config's


def settings(name, entry):
  """An evaluator's settings: its kind's defaults, then the config's."""
  entry = dict(entry)
  kind = entry.pop("kind", None)
  if kind not in KINDS:
    raise errors.ConfigError(f"config.evaluators.{name}.kind must be one of "
                             f"{', '.join(KINDS)}, got {kind!r}")
  every = entry.pop("every", None)
  if not isinstance(every, int) or every < 0:
    raise errors.ConfigError(
        f"config.evaluators.{name}.every must be an integer "
        f">= 0 (0: never), got {every!r}")
  defaults = KINDS[kind][1]
  unknown = set(entry) - set(defaults)
  if unknown:
    raise errors.ConfigError(
        f"config.evaluators.{name} has no setting "
        f"{', '.join(sorted(unknown))}; a {kind} evaluator takes "
        f"{', '.join(['kind', 'every', *defaults])}")
  return kind, every, ml_collections.FrozenConfigDict({**defaults, **entry})


def enabled(keys):
  """The Evaluation of each evaluator that a run's `keys` (runs/settings.py)
  run, every evaluator's settings checked (a ConfigError names the key)."""
  parsed = [Evaluation(name, *settings(name, entry))
            for name, entry in keys.evaluators.items()]
  return tuple(entry for entry in parsed if entry.every)


def check(evaluations, data):
  """A ConfigError for the settings of `evaluations` (`enabled`'s) that
  the data (`data`: the run's Sources) cannot give."""
  for evaluation in evaluations:
    name = evaluation.name
    try:
      KINDS[evaluation.kind][0].check(evaluation.settings, data)
    except errors.InputError as e:
      raise errors.ConfigError.of(
          e, f"config.evaluators.{name}",
          hint=f"or turn it off: --config.evaluators.{name}.every=0") from None


class Evaluators:
  """The run's evaluators, each compiled on its first use."""

  def __init__(self, run, program):
    self.total_steps = run.settings.total_steps
    self.scheduled = [
        (evaluation.every, KINDS[evaluation.kind][0](
            evaluation.name, evaluation.settings, run, program))
        for evaluation in run.evaluations]

  def _due(self, step):
    return [evaluator for every, evaluator in self.scheduled
            if reporting.due(step, every, self.total_steps)]

  def any_due(self, step):
    return bool(self._due(step))

  def run_due(self, step, params):
    """The metrics of every evaluator due at `step` (those whose `every`
    divides it, and all at the last step)."""
    metrics = {}
    for evaluator in self._due(step):
      metrics.update(evaluator(params))
    return metrics

  def run_all(self, params):
    return self.run_due(self.total_steps, params)
