"""ImageNet ReaL: top-1 accuracy against the Reassessed Labels.

Each validation image has a set of correct labels (Beyer et al. 2020); a
prediction is right when it is in the set, and images whose set is empty
are not counted. Settings (config.evaluators.NAME): dataset (TFDS
imagenet2012_real, whose "real_label" feature holds the sets) and split.
Logs NAME_accuracy and NAME_examples, as the accuracy evaluator.
"""

import jax.numpy as jnp
import numpy as np

from vit_jax.data.lazy_tensorflow import tf
from vit_jax.training.evaluators import accuracy as top1

DEFAULTS = dict(dataset="imagenet2012_real", split="validation")
LABELS_FEATURE = "real_label"


def hits(logits, real):
  """(correct, labelled), booleans per image: whether the top-1 class is in
  the image's set, given as a multi-hot `real` [images, classes], and
  whether the set is non-empty."""
  real = jnp.asarray(real) > 0
  top1 = jnp.argmax(logits, axis=-1)
  correct = jnp.take_along_axis(real, top1[:, None], axis=-1)[:, 0]
  return correct, real.any(axis=-1)


def accuracy(logits, real_labels):
  """ReaL accuracy of `logits` [images, classes]; `real_labels` holds one
  collection of correct classes per image (empty: the image is skipped)."""
  logits = np.asarray(logits)
  if len(real_labels) != len(logits):
    raise ValueError(f"{len(logits)} rows of logits but {len(real_labels)} "
                     "label sets")
  real = np.zeros(logits.shape, bool)
  for row, labels in enumerate(real_labels):
    real[row, list(labels)] = True
  correct, labelled = hits(logits, real)
  if not labelled.any():
    raise ValueError("every label set is empty: nothing to score")
  return int(correct.sum()) / int(labelled.sum())


def counts(logits, batch):
  """Right predictions and labelled examples in a masked batch whose "real"
  holds each image's label set as a multi-hot."""
  correct, labelled = hits(logits, batch["real"])
  counted = labelled & (batch["mask"] > 0)
  return {"correct": (correct & counted).sum(), "count": counted.sum()}


class Real(top1.Accuracy):
  """Top-1 against the label sets: the accuracy evaluator, counting hits in
  the sets its examples bring along."""

  counts = staticmethod(counts)

  def __init__(self, name, settings, run, program):
    self.num_classes = run.sources(settings.dataset).num_classes
    super().__init__(name, settings, run, program)

  def extras(self, example):
    """The example's label set as a fixed-size multi-hot, for batching."""
    sets = tf.one_hot(example[LABELS_FEATURE], self.num_classes,
                      dtype=tf.uint8)
    return {"real": tf.reduce_max(sets, axis=0)}  # Empty set: all zeros.
