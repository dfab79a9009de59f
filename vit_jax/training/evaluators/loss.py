"""The objective's loss on held-out data, the mean over a split's examples
(each counted once across hosts): what a run that learns without labels
(masked autoencoders: the reconstruction loss) watches for overfitting.

Settings (config.evaluators.NAME): split, and dataset ("": the run's
config.dataset). Logs NAME_loss and NAME_examples (and
NAME_skipped_examples, those whose image does not decode, if any). The
objective's `held_out` gives each example's loss; what it draws (MAE's
masks) is drawn alike at every evaluation, so the numbers of a run's
evaluations compare.
"""

from vit_jax.training.evaluators import batches

DEFAULTS = dict(dataset="", split="test")


class HeldOutLoss:

  def __init__(self, name, settings, run, program):
    self.name = name
    objective = run.parts.objective

    def sums(params, batch):
      mask = batch["mask"]
      per_example = objective.held_out(params, batch)
      return {"loss": (per_example * mask).sum(), "examples": mask.sum()}

    self.step = batches.jit(program, sums)
    self.total = run.sources(settings.dataset).num_examples(settings.split)
    self.batches = batches.Batches(program, run, settings.dataset,
                                   settings.split)

  @staticmethod
  def check(settings, data):
    batches.check_split(data, settings.dataset, settings.split)

  def __call__(self, params):
    totals = {"loss": 0.0, "examples": 0}
    for batch in self.batches:
      for key, value in self.step(params, batch).items():
        totals[key] += float(value) if key == "loss" else int(value)
    return {f"{self.name}_loss": totals["loss"] / max(totals["examples"], 1),
            **batches.scored(self.name, self.total, totals["examples"])}
