"""Top-1 accuracy over a split, every example counted once across hosts.

Settings (config.evaluators.NAME): split, and dataset ("": the run's
config.dataset). Logs NAME_accuracy and NAME_examples, the examples scored
(and NAME_skipped_examples, those whose image does not decode, if any);
in a distilling run also NAME_teacher_agreement, the share of the examples
scored whose top-1 class is the teacher's.
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
    self.teacher = program.frozen and program.frozen.teacher
    self.step = batches.jit(program, self.scores,
                            with_frozen=self.teacher is not None)
    self.total = run.sources(settings.dataset).num_examples(settings.split)
    self.batches = batches.Batches(program, run, settings.dataset,
                                   settings.split, extras=self.extras)

  @staticmethod
  def check(settings, data):
    batches.check_split(data, settings.dataset, settings.split)

  def extras(self, example):  # pylint: disable=unused-argument
    return {}

  def scores(self, params, batch, teacher_params=None):
    """What `counts` counts in a batch, the examples scored (mask 1: ReaL
    counts only those with a label set), and those where the teacher's
    top-1 class is the model's."""
    images = naflex.inputs_of(batch)
    logits = self.program.model.apply({"params": params}, images,
                                      train=False)
    scores = {**self.counts(logits, batch), "examples": batch["mask"].sum()}
    if self.teacher is not None:
      taught = jnp.argmax(self.teacher.logits(teacher_params, images), -1)
      scores["agreed"] = ((taught == jnp.argmax(logits, -1))
                          * batch["mask"]).sum()
    return scores

  def __call__(self, params):
    step = self.step
    if self.teacher is not None:
      teacher_params = self.program.frozen.params()

      def step(params, batch):
        return self.step(params, batch, teacher_params)
    totals = batches.sum_over(step, params, self.batches)
    agreement = ({f"{self.name}_teacher_agreement":
                  totals["agreed"] / totals["examples"]}
                 if self.teacher is not None else {})
    return {f"{self.name}_accuracy": totals["correct"] / totals["count"],
            **agreement,
            **batches.scored(self.name, self.total, totals["examples"])}
