"""The training losses: `of_batch`, what the train step differentiates,
and the classifier's cross-entropies under it, one value per example.

`targets` are integer labels [n], or rows of class weights [n, classes]:
one-hot, smoothed or mixed distributions (vit_jax/training/targets.py), or
the multi-hot rows of a multi-label dataset.

  softmax  the cross-entropy of the softmax over the classes with the
           target distribution: -sum_c t_c log softmax(z)_c. Integer labels
           take optax's integer form, so that the defaults' step is the
           plain integer-label one to the bit (targets.py).
  sigmoid  each class its own binary problem: -sum_c [t_c log s(z_c) +
           (1 - t_c) log (1 - s(z_c))], summed over the classes as
           big_vision's sigmoid_xent does (not averaged, so its gradient
           per logit does not shrink with the number of classes).
"""

import jax
import optax

from vit_jax import errors, models
from vit_jax.models import masked_patches

KINDS = ("softmax", "sigmoid")


def check(kind):
  if kind not in KINDS:
    raise errors.InputError(
        f"unknown loss {kind!r}: expected one of {list(KINDS)}")


def cross_entropy(kind, logits, targets):
  """Per-example loss [n] of float32 logits [n, classes]."""
  check(kind)
  if targets.ndim == logits.ndim - 1:  # Integer labels.
    if kind == "softmax":
      return optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    targets = jax.nn.one_hot(targets, logits.shape[-1], dtype=logits.dtype)
  if kind == "softmax":
    return optax.softmax_cross_entropy(logits, targets)
  return optax.sigmoid_binary_cross_entropy(logits, targets).sum(axis=-1)



def of_batch(model, params, images, targets, weights, key, kind="softmax",
             teacher=None, teacher_logits=None):
  """(the loss the step differentiates, {name: a part of it}): the
  examples' losses summed with `weights` (1/n each for the mean over n; 0
  leaves a row out). A classifier's are cross-entropies (`kind`) with
  `targets`, and `key` draws the dropout; masked patch prediction's are
  `masked_patch_losses`. With a distill.Teacher and its logits on these
  images, each example's loss mixes in its distillation term, logged as
  the part "distill_loss"; a model with a distillation token then learns
  the targets by its class head and the teacher by its own head."""
  if isinstance(model, models.MaskedPatchViT):
    per_image = masked_patch_losses(model, params, images,
                                    *jax.random.split(key))
    return (weights * per_image).sum(), {}
  both_heads = teacher is not None and model.config.distill_token
  logits = model.apply({"params": params}, images, train=True,
                       both_heads=both_heads, rngs={"dropout": key})
  logits, distill_logits = logits if both_heads else (logits, logits)
  per_image = cross_entropy(kind, logits, targets)
  if teacher is None:
    return (weights * per_image).sum(), {}
  distilled = teacher.loss(distill_logits, teacher_logits)
  per_image = (teacher.label_weight * per_image
               + (1 - teacher.label_weight) * distilled)
  return (weights * per_image).sum(), {
      "distill_loss": (weights * distilled).sum()}


def masked_patch_losses(model, params, images, key, dropout_key):
  """Each image's mean cross-entropy over its corrupted patches, whose
  targets are their own mean colours (models/masked_patches.py), not the
  labels. Every image has as many corrupted patches, so weights of 1/n give
  the mean over all corrupted patches. `key` draws the corruption."""
  stride = model.token_stride
  corruption = masked_patches.corrupt(key, images.shape[0],
                                      (images.shape[1] // stride) ** 2)
  logits = model.apply({"params": params}, images, train=True,
                       corruption=corruption, rngs={"dropout": dropout_key})
  per_patch = optax.softmax_cross_entropy_with_integer_labels(
      logits, masked_patches.targets(images, stride))
  corrupted = corruption.corrupted.astype(per_patch.dtype)
  return (per_patch * corrupted).sum(axis=1) / corrupted.sum(axis=1)
