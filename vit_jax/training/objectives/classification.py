"""Classification: the paper's objective, labels through a classifier's
head, with its recipes (label smoothing, Mixup, CutMix, the sigmoid loss;
training/targets.py), masked patch prediction (config.model.mpp, its
Section 4.6; training/losses.py), and distillation from a frozen teacher
(config.distill; training/distill.py)."""

from vit_jax import errors, models
from vit_jax.models import naflex
from vit_jax.training import distill, losses, targets
from vit_jax.training.objectives import base

# What a NaFlex or a packed batch carries beside its pixels
# (naflex.inputs_of).
NAFLEX_FIELDS = ("grid", "segments", "positions", "grids")


class Classification(base.Objective):
  """A classifier (or masked patch prediction's model) of `keys`' model
  for `num_classes`, learning with `teacher` (distill.load's) where the
  run distils."""

  def __init__(self, keys, num_classes, teacher=None):
    super().__init__(models.create_from_settings(keys.model, num_classes),
                     keys.seed)
    self.recipe = targets.Recipe.of(keys, num_classes)
    self.teacher = teacher

  @classmethod
  def check(cls, keys):
    targets.check(keys)
    distill.check(keys)

  @classmethod
  def paths(cls, keys):
    return ((keys.distill.teacher, "config.distill.teacher"),)

  @classmethod
  def pinned(cls, keys, recorded=None):
    return distill.pinned(keys, recorded)

  @classmethod
  def load(cls, keys):
    return distill.load(keys)

  @classmethod
  def reads_labels(cls, keys):
    return not keys.model.mpp

  @property
  def frozen(self):
    return self.teacher

  name = "classification"

  def check_run(self, keys, evaluations):
    super().check_run(keys, evaluations)
    distill.check_student(keys, self.model)
    classifying = [evaluation.name for evaluation in evaluations]
    if keys.model.mpp and classifying:
      raise errors.ConfigError(
          f"config.model.mpp pre-trains without labels, but evaluators "
          f"{classifying} would classify: set their `every` to 0 "
          "(configs/mpp.py does)")

  def prepare(self, batch, step):
    """The images mixed and the labels made targets (the recipe); a packed
    batch's labels, a row of slots each, go through it one image a row."""
    labels, packed = batch["label"], "segments" in batch
    if packed:
      labels = labels.reshape(-1, *labels.shape[2:])
    images, target = self.recipe(batch["image"], labels,
                                 self.stream(targets.MIX_STREAM, step))
    if packed:
      target = target.reshape(*batch["mask"].shape, *target.shape[1:])
    # A NaFlex or packed batch's grids go with its images.
    return {"image": images, "target": target, "mask": batch["mask"],
            **{key: batch[key] for key in NAFLEX_FIELDS if key in batch}}

  def teach(self, held, micro):
    """The teacher's logits on the images as the student sees them."""
    if self.teacher is None:
      return micro
    return {**micro, "teacher_logits": self.teacher.logits(
        held.frozen, naflex.inputs_of(micro))}

  def loss(self, params, micro, weights, key):
    return losses.of_batch(self.model, params, naflex.inputs_of(micro),
                           micro["target"], weights, key, self.recipe.loss,
                           self.teacher, micro.get("teacher_logits"))

  def flops_per_image(self, image_size, num_patches=None, slots=1):
    return (super().flops_per_image(image_size, num_patches, slots)
            + distill.flops_per_image(self.teacher))
