"""Zero-shot classification by a two-tower model (config.objective
"image_text"), as CLIP and big_vision's discriminative classifier
evaluate one.

Each class's captions (its names, '|' between synonyms, in each of the
templates; data/captions.py) go through the text tower; their normalised
embeddings are averaged and normalised again: the class's embedding. An
image is classified as the class whose embedding is nearest its own
(the largest dot product; the learned scale and bias change no ranking).
Ties go to the lower class.

Settings (config.evaluators.NAME): datasets, a dict of TFDS name -> the
split classified; templates, "{}" where the name goes (templates the
training captions never used make the test zero-shot); class_names,
each class's names, () for config.image_text.class_names. Logs
NAME/<dataset>_accuracy.
"""

import numpy as np

from vit_jax import errors
from vit_jax.training.evaluators import batches
from vit_jax.training.objectives import image_text

DEFAULTS = dict(datasets={}, templates=(), class_names=())


class ZeroShot(batches.FeatureEvaluator):

  kind = "zero_shot"

  def __init__(self, name, settings, run, program):
    super().__init__(name, settings, run, program)
    self.tokenizer = run.parts.objective.tokenizer
    self.embed_texts = batches.jit_texts(program, run.parts.objective)
    self.templates, self.class_names = batches.class_captions(
        name, settings, run, settings.datasets)

  @classmethod
  def check(cls, settings, data):
    if not settings.datasets:
      raise errors.InputError("a zero_shot evaluator needs datasets: {TFDS "
                              "name: split}")
    for dataset, split in settings.datasets.items():
      batches.check_split(data, dataset, split)
    if not settings.templates:
      raise errors.InputError("a zero_shot evaluator needs templates, '{}' "
                              "where the class name goes")

  def __call__(self, params):
    metrics = {}
    for dataset, split in self.settings.datasets.items():
      classes = image_text.class_embeddings(
          lambda ids: self.embed_texts(params, ids), self.tokenizer,
          self.templates, self.class_names)
      features, labels = self.collect(params, dataset, split)
      predicted = np.argmax(features @ classes.T, axis=1)
      metrics[f"{self.name}/{dataset}_accuracy"] = float(
          np.mean(predicted == labels))
    return metrics
