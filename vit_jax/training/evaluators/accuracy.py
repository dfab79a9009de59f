"""Top-1 accuracy over a split, every example counted once across hosts.

Settings (config.evaluators.NAME): split, and dataset ("": the run's
config.dataset). Logs NAME_accuracy and NAME_examples, the examples scored
(and NAME_skipped_examples, those whose image does not decode, if any).
"""

import jax.numpy as jnp

from vit_jax.models import naflex
from vit_jax.training.evaluators import batches

DEFAULTS = dict(dataset="", split="test")


def counts(logits, batch):
  """Correct top-1 predictions and examples in a masked batch. With
  multi-hot labels (a multi-label dataset) the top class is correct when it
  is one of the example's."""
  top = jnp.argmax(logits, axis=-1)
  if batch["label"].ndim == 2:
    hits = jnp.take_along_axis(batch["label"], top[:, None], axis=1)[:, 0] > 0
  else:
    hits = top == batch["label"]
  hits = hits * batch["mask"]
  return {"correct": hits.sum(), "count": batch["mask"].sum()}


class Accuracy:
  """Top-1 on a split; subclasses change what is counted (`counts`) and
  what each example brings besides its image and label (`extras`)."""

  counts = staticmethod(counts)

  def __init__(self, name, settings, run, program):
    self.name, self.settings, self.run = name, settings, run
    self.program = program
    # Examples scored (mask 1) beside what `counts` counts: ReaL counts
    # only those with a label set.
    self.step = batches.jit(program, lambda params, batch: {
        **self.counts(program.model.apply(
            {"params": params}, naflex.inputs_of(batch), train=False),
                      batch),
        "examples": batch["mask"].sum()})
    self.total = run.sources(settings.dataset).num_examples(settings.split)
    self.batches = batches.Batches(program, run, settings.dataset,
                                   settings.split, extras=self.extras)

  @staticmethod
  def check(settings, data):
    batches.check_split(data, settings.dataset, settings.split)

  def extras(self, example):  # pylint: disable=unused-argument
    return {}

  def __call__(self, params):
    totals = batches.sum_over(self.step, params, self.batches)
    return {f"{self.name}_accuracy": totals["correct"] / totals["count"],
            **batches.scored(self.name, self.total, totals["examples"])}
