"""Image-text retrieval by a two-tower model (config.objective
"image_text"): recall at k, both ways, as CLIP and SigLIP report COCO's
and Flickr30k's.

The texts of a split are its images' captions (a captioned dataset's,
data/captioned.py or a TFDS "captions" feature: each image may have
several), or, for a labelled one, every class's captions from the run's
templates and class names (data/captions.py), an image's own being its
class's. Every image and every text is embedded; an image finds a text
at k when one of its own texts is among the k texts nearest it, and a
text finds its image when one of the images it belongs to is among the
k nearest it. Ties go to the earlier text or image.

Settings (config.evaluators.NAME): datasets, a dict of TFDS name -> the
split searched; ks (1, 5, 10); for a labelled split, templates and
class_names (() for config.image_text's). Logs NAME/<dataset>_image_to_text_r@<k>
and NAME/<dataset>_text_to_image_r@<k>.
"""

import numpy as np

from vit_jax import errors
from vit_jax.data import captions as captions_lib, sources
from vit_jax.training.evaluators import batches

DEFAULTS = dict(datasets={}, ks=(1, 5, 10), templates=(), class_names=())
# Texts embedded at once: one compiled shape for every split.
TEXT_BATCH = 256


def recall(similarity, relevant, ks):
  """{k: the share of rows with a relevant column among their k most
  similar}: similarity [rows, columns], relevant [rows, columns] bool."""
  order = np.argsort(-similarity, axis=1, kind="stable")
  found = np.take_along_axis(relevant, order, axis=1)
  first = np.where(found.any(axis=1), found.argmax(axis=1), np.inf)
  return {k: float(np.mean(first < k)) for k in ks}


class Retrieval(batches.FeatureEvaluator):

  kind = "retrieval"

  def __init__(self, name, settings, run, program):
    super().__init__(name, settings, run, program)
    self.tokenizer = run.parts.objective.tokenizer
    self.embed_texts = batches.jit_texts(program, run.parts.objective)
    self._texts = {}  # dataset, split: (token ids, owner of each text)
    self.templates, self.class_names = batches.class_captions(
        name, settings, run, [dataset for dataset in settings.datasets
                              if run.sources(dataset).captions is None])

  @classmethod
  def check(cls, settings, data):
    if not settings.datasets:
      raise errors.InputError("a retrieval evaluator needs datasets: {TFDS "
                              "name: split}")
    if not settings.ks or min(settings.ks) < 1:
      raise errors.InputError(
          f"retrieval ks must be integers >= 1, got {settings.ks!r}")
    for dataset, split in settings.datasets.items():
      batches.check_split(data, dataset, split)

  def texts(self, dataset, split):
    """(token ids [texts, length], which image (by its place in the split)
    or class each text is of [texts], whether those are classes)."""
    if (dataset, split) not in self._texts:
      source = self.run.sources(dataset)
      if source.captions is not None:
        captions = sources.captions_in(source, split)
        texts = [text for texts in captions for text in texts]
        owners = [place for place, texts in enumerate(captions)
                  for _ in texts]
        by_class = False
      else:
        captions = captions_lib.of_classes(self.templates, self.class_names)
        texts = [text for texts in captions for text in texts]
        owners = [label for label, texts in enumerate(captions)
                  for _ in texts]
        by_class = True
      self._texts[dataset, split] = (self.tokenizer.encode(texts),
                                     np.asarray(owners), by_class)
    return self._texts[dataset, split]

  def embedded_texts(self, params, ids):
    count = len(ids)
    padded = -(-count // TEXT_BATCH) * TEXT_BATCH
    ids = np.concatenate([ids, np.repeat(ids[:1], padded - count, axis=0)])
    return np.concatenate([
        np.asarray(self.embed_texts(params, ids[start:start + TEXT_BATCH]))
        for start in range(0, padded, TEXT_BATCH)])[:count]

  def __call__(self, params):
    metrics = {}
    for dataset, split in self.settings.datasets.items():
      ids, owners, by_class = self.texts(dataset, split)
      texts = self.embedded_texts(params, ids)
      images, labels, places = self.collect(params, dataset, split,
                                            with_index=True)
      mine = labels if by_class else places
      relevant = mine[:, None] == owners[None, :]
      similarity = images @ texts.T
      for direction, found in (
          ("image_to_text", recall(similarity, relevant, self.settings.ks)),
          ("text_to_image", recall(similarity.T, relevant.T,
                                   self.settings.ks))):
        for k, value in found.items():
          metrics[f"{self.name}/{dataset}_{direction}_r@{k}"] = value
    return metrics
