"""The classifier's training losses, one value per example.

`targets` are integer labels [n], or rows of class weights [n, classes]:
one-hot, smoothed or mixed distributions (vit_jax/training/targets.py), or
the multi-hot rows of a multi-label dataset.

  softmax  the cross-entropy of the softmax over the classes with the
           target distribution: -sum_c t_c log softmax(z)_c. Integer labels
           take optax's integer form, today's loss to the bit.
  sigmoid  each class its own binary problem: -sum_c [t_c log s(z_c) +
           (1 - t_c) log (1 - s(z_c))], summed over the classes as
           big_vision's sigmoid_xent does (not averaged, so its gradient
           per logit does not shrink with the number of classes).
"""

import jax
import optax

from vit_jax import errors

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

