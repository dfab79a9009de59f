"""Self-distillation's losses as functions of arrays (DINO, Caron et al.
2021; iBOT, Zhou et al. 2022; DINOv2, Oquab et al. 2024), with the
argument meanings of Meta's DINOv2 code (dinov2/loss/), so that users can
check them against it; tests/test_dino_losses.py does, on arrays recorded
from Meta's modules (benchmarks/record_dinov2_losses.py).

Logits are a head's outputs before any softmax; probabilities ("probs")
are a teacher's targets after centering and sharpening. The last axis is
the prototypes' (K). Every reduction over the batch is a plain sum or mean
over the arrays given: under `jax.jit` with the batch sharded over a
mesh, they are the global batch's (XLA adds the all-reduces Meta's code
calls by hand), so the numbers do not depend on how the batch is split.

  dino_loss(student_logits, teacher_probs, student_temperature)
      the sum over (student crop, teacher crop) pairs of the batch mean of
      the cross-entropy H(teacher, softmax(student / temperature));
  sinkhorn_knopp(teacher_logits, teacher_temperature, iterations)
      each row's soft assignment to the prototypes, balanced over the batch;
  softmax_centered(teacher_logits, center, teacher_temperature) and
  updated_center(center, batch_mean, momentum)
      DINO's running center instead of Sinkhorn-Knopp;
  ibot_patch_loss(student_patch_logits, teacher_patch_probs, masks,
                  student_temperature)
      per image the mean over its masked patches, then the batch mean;
  koleo_loss(features)
      Kozachenko-Leonenko's spread: minus the mean log distance of each
      (normalised) row to its nearest other row;
  gram_loss(student_features, teacher_features)
      DINOv3's Gram anchoring (Simeoni et al. 2025, dinov3/loss/): the mean
      squared difference of the student's and a Gram teacher's patch
      similarities (the objective does not yet train with it).
"""

import jax
import jax.numpy as jnp

STUDENT_TEMPERATURE = 0.1  # DINOLoss's and iBOTPatchLoss's default
CENTER_MOMENTUM = 0.9
SINKHORN_ITERATIONS = 3
KOLEO_EPSILON = 1e-8  # KoLeoLoss's normalisation and distance epsilon
GRAM_EPSILON = 1e-12  # torch's F.normalize default, which GramLoss uses


def cross_entropies(student_logits, teacher_probs, student_temperature):
  """[...] : -sum_k teacher_probs * log_softmax(student_logits /
  temperature), over the last axis, in float32."""
  log_probs = jax.nn.log_softmax(
      student_logits.astype(jnp.float32) / student_temperature, axis=-1)
  return -(teacher_probs.astype(jnp.float32) * log_probs).sum(axis=-1)


def pairwise_cross_entropies(student_logits, teacher_probs,
                             student_temperature):
  """[N]: each example's sum, over every (student crop, teacher crop)
  pair, of its cross-entropy. student_logits [S, N, K] (S crops),
  teacher_probs [T, N, K]."""
  log_probs = jax.nn.log_softmax(
      student_logits.astype(jnp.float32) / student_temperature, axis=-1)
  # The pairs' sum is bilinear: sum_s sum_t <t, log p_s> = <sum_t t,
  # sum_s log p_s>, one product instead of S x T.
  return -(teacher_probs.astype(jnp.float32).sum(axis=0)
           * log_probs.sum(axis=0)).sum(axis=-1)


def dino_loss(student_logits, teacher_probs,
              student_temperature=STUDENT_TEMPERATURE):
  """DINOLoss.forward: the sum over (student crop, teacher crop) pairs of
  the batch mean of the cross-entropy. Lists of [N, K] crops, or stacks
  [crops, N, K]."""
  student = jnp.stack(list(student_logits)) if isinstance(
      student_logits, (list, tuple)) else student_logits
  teacher = jnp.stack(list(teacher_probs)) if isinstance(
      teacher_probs, (list, tuple)) else teacher_probs
  return pairwise_cross_entropies(student, teacher,
                                  student_temperature).mean()


def sinkhorn_knopp(teacher_logits, teacher_temperature,
                   iterations=SINKHORN_ITERATIONS, valid=None):
  """[B, K]: each of the B rows' assignment to the K prototypes (a row
  sums to 1), by `iterations` of Sinkhorn-Knopp on exp(logits /
  temperature), which balance the prototypes' total weight over the batch
  (DINOLoss.sinkhorn_knopp_teacher). `valid` [B] (bool), where given:
  only those rows count (iBOT's masked patches, the rest padding); their
  number is B in the normalisation, and the rest come out zero.

  The logits' maximum is taken out before the exponential: the first
  normalisation divides it out again, and a large logit over a small
  temperature would overflow float32."""
  logits = teacher_logits.astype(jnp.float32) / teacher_temperature
  if valid is None:
    valid = jnp.ones(logits.shape[:1], bool)
  logits = jnp.where(valid[:, None], logits, -jnp.inf)
  q = jnp.exp(logits - jax.lax.stop_gradient(logits.max()))
  count = valid.sum().astype(jnp.float32)
  num_prototypes = logits.shape[1]
  q = q / q.sum()
  for _ in range(iterations):
    # Each prototype's total weight 1 / K ...
    q = q / q.sum(axis=0, keepdims=True) / num_prototypes
    # ... and each row's 1 / B (padding rows stay zero).
    q = q / jnp.maximum(q.sum(axis=1, keepdims=True), 1e-30) / count
  return q * count


def softmax_centered(teacher_logits, center, teacher_temperature):
  """DINO's centering: softmax((logits - center) / temperature)."""
  return jax.nn.softmax((teacher_logits.astype(jnp.float32) - center)
                        / teacher_temperature, axis=-1)


def updated_center(center, batch_mean, momentum=CENTER_MOMENTUM):
  """The center after a batch whose teacher logits average `batch_mean`:
  momentum * center + (1 - momentum) * batch_mean."""
  return momentum * center + (1 - momentum) * batch_mean


def masked_patch_cross_entropies(student_patch_logits, teacher_patch_probs,
                                 masks, student_temperature):
  """[N]: each image's mean cross-entropy over its masked patches (0
  where none is masked). [N, L, K], [N, L, K], masks [N, L]."""
  per_patch = cross_entropies(student_patch_logits, teacher_patch_probs,
                              student_temperature)
  masks = masks.astype(jnp.float32)
  return (per_patch * masks).sum(axis=-1) / jnp.maximum(
      masks.sum(axis=-1), 1.0)


def ibot_patch_loss(student_patch_logits, teacher_patch_probs, masks,
                    student_temperature=STUDENT_TEMPERATURE):
  """iBOTPatchLoss.forward: per image the mean cross-entropy over its
  masked patches, then the mean over the N images (those with no masked
  patch count as 0)."""
  return masked_patch_cross_entropies(
      student_patch_logits, teacher_patch_probs, masks,
      student_temperature).mean()


def normalised(features, epsilon=KOLEO_EPSILON):
  """Rows divided by max(their L2 norm, epsilon), as torch's normalize."""
  features = features.astype(jnp.float32)
  norms = jnp.sqrt((features ** 2).sum(axis=-1, keepdims=True))
  return features / jnp.maximum(norms, epsilon)


def koleo_distances(features, epsilon=KOLEO_EPSILON, counted=None):
  """[N]: each normalised row's distance to its nearest other row (the
  largest inner product), as torch's PairwiseDistance measures it:
  ||x - y + epsilon||. `counted` [N] bool, where given: only those rows
  are anyone's neighbour."""
  x = normalised(features, epsilon)
  dots = x @ x.T
  others = ~jnp.eye(x.shape[0], dtype=bool)
  if counted is not None:
    others = others & counted[None, :]
  dots = jnp.where(others, dots, -1.0)
  nearest = x[jnp.argmax(dots, axis=1)]
  return jnp.sqrt(((x - nearest + epsilon) ** 2).sum(axis=-1))


def koleo_loss(features, epsilon=KOLEO_EPSILON):
  """KoLeoLoss.forward on features [N, D]: -mean log(distance to the
  nearest other row + epsilon), the rows normalised first."""
  return -jnp.log(koleo_distances(features, epsilon) + epsilon).mean()


def gram_loss(student_features, teacher_features, normalize=True,
              image_level=True, remove_negatives=False,
              remove_only_teacher_negatives=False):
  """GramLoss.forward (DINOv3): the mean over all entries of (student's
  Gram matrix - teacher's)^2, in float32. Features [B, N, D], patches of
  B images: one N x N matrix of each image's patches (`image_level`), or
  one (B N) x (B N) matrix over all of them. `normalize`: each row
  L2-normalised first (the Gram matrix of cosines). `remove_negatives`:
  both matrices' negative entries set to 0 (GramLoss's own default;
  DINOv3's training configs turn it off, and so does this function);
  `remove_only_teacher_negatives`: the teacher's only. (Meta's code then
  also zeroes the student's entries where both are negative, but reads the
  teacher's already zeroed, so it zeroes none: as here.)"""
  if remove_negatives and remove_only_teacher_negatives:
    raise ValueError("remove_negatives or remove_only_teacher_negatives, "
                     "not both")

  def gram(features):
    x = features.astype(jnp.float32)
    if normalize:
      x = normalised(x, GRAM_EPSILON)
    if not image_level:
      x = x.reshape(-1, x.shape[-1])
    return x @ jnp.swapaxes(x, -1, -2)

  student, teacher = gram(student_features), gram(teacher_features)
  if remove_negatives or remove_only_teacher_negatives:
    teacher = jnp.maximum(teacher, 0.0)
  if remove_negatives:
    student = jnp.maximum(student, 0.0)
  return ((student - teacher) ** 2).mean()
