"""What the loss is asked to predict: a batch's labels as targets, smoothed
and mixed, on the device inside the train step.

With the defaults (softmax loss, no smoothing, no mixing) the targets are
the integer labels themselves, and the step is the plain integer-label one
to the bit (tests/test_targets.py).
Anything else makes them rows of class weights [n, classes]:

  label_smoothing e   each one-hot row becomes (1 - e) * onehot + e / K
                      (Szegedy et al. 2016), so a row still sums to 1.
  mixup (prob, alpha) with probability `prob` a batch is mixed: one ratio
                      lam ~ Beta(alpha, alpha) for the whole batch, every
                      image lam * itself + (1 - lam) * its partner's, and
                      so are the targets (Zhang et al. 2018).
  cutmix (prob, alpha) with probability `prob` (after mixup's share of the
                      draw) one box, its area a fraction 1 - lam of the
                      image with lam ~ Beta(alpha, alpha), takes the
                      partner's pixels; the targets are weighted by the
                      pixels each image keeps (Yun et al. 2019).

  random_erasing p    before any mixing, each image with probability p has
                      one box replaced by noise N(0, 1) per pixel and
                      channel, in [-1, 1]'s units (timm's RandomErasing,
                      mode "pixel", as MAE's fine-tuning uses it at 0.25):
                      its area 2%-33% of the image, log-uniform aspect
                      0.3-3.3, the first of 10 draws that fits, else none.
                      Keyed by (run seed, step, row of the global batch).

One draw per step decides which (none, mixup or cutmix), so their
probabilities add up to at most 1. Each example's partner is the next one
within its block of the global batch, a block being one input share's rows
(vit_jax/data/shares.py; the last row pairs with the first): a block lies
on one device, so pairing moves no data between devices, and the input
shares are fixed for the whole run, so the mixed batch of a step is the
same on any number of devices or processes. The draws are keyed by (run
seed, step): a resumed run mixes as an uninterrupted one.

Mixing runs on the device, where the images become float anyway; the host
keeps sending uint8 (docs/from_scratch.md has the measurement).
"""

import dataclasses

import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import encoder
from vit_jax.training import losses

# Folded into the run's seed for the mixing draws, so that they are a
# stream of their own, apart from the dropout's (step.py).
MIX_STREAM = 0x6d6978  # "mix"
# Folded into the step's mixing key for random erasing, so that turning it
# on leaves the mixing draws as they were.
ERASE_STREAM = 0x657261  # "era"
ERASE_AREA = (0.02, 1 / 3)
ERASE_ASPECT = 0.3  # to 1 / 0.3, log-uniform
ERASE_TRIES = 10


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How a step turns a batch's images and labels into the model's inputs
  and the loss's targets."""
  num_classes: int
  loss: str = "softmax"
  label_smoothing: float = 0.0
  mixup_prob: float = 0.0
  mixup_alpha: float = 0.0
  cutmix_prob: float = 0.0
  cutmix_alpha: float = 0.0
  groups: int = 1  # Blocks of the batch that partners are found within.
  erasing_prob: float = 0.0

  @classmethod
  def of(cls, settings, num_classes):
    """The recipe of a run's `settings` (runs/settings.py)."""
    return cls(num_classes=num_classes, loss=settings.loss,
               label_smoothing=settings.label_smoothing,
               mixup_prob=settings.mixup.prob,
               mixup_alpha=settings.mixup.alpha,
               cutmix_prob=settings.cutmix.prob,
               cutmix_alpha=settings.cutmix.alpha,
               groups=settings.input_shares or 1,
               erasing_prob=settings.random_erasing)

  @property
  def mixes(self):
    return self.mixup_prob > 0 or self.cutmix_prob > 0

  @property
  def soft(self):
    """Whether the targets are rows of class weights rather than labels."""
    return self.loss != "softmax" or self.label_smoothing > 0 or self.mixes

  def __call__(self, images, labels, key):
    """(images, targets) for the loss; `key` draws the mixing of this step.
    Integer labels [n] or multi-hot rows [n, classes] go in."""
    if self.erasing_prob:
      images = erase(encoder.unit_range(images), self.erasing_prob,
                     jax.random.fold_in(key, ERASE_STREAM))
    if not self.soft:
      return images, labels
    targets = smooth(labels, self.num_classes, self.label_smoothing)
    if self.mixes:
      images, targets = self.mix(encoder.unit_range(images), targets, key)
    return images, targets

  def mix(self, images, targets, key):
    """Mixup, CutMix or neither, one draw for the whole batch."""
    choice_key, mixup_key, cutmix_key, box_key = jax.random.split(key, 4)
    draw = jax.random.uniform(choice_key)
    do_mixup = draw < self.mixup_prob
    do_cutmix = ~do_mixup & (draw < self.mixup_prob + self.cutmix_prob)
    height, width = images.shape[1:3]
    kept = jnp.ones((height, width), jnp.float32)  # What each image keeps.
    if self.mixup_prob > 0:
      ratio = jax.random.beta(mixup_key, self.mixup_alpha, self.mixup_alpha)
      kept = jnp.where(do_mixup, ratio, kept)
    if self.cutmix_prob > 0:
      ratio = jax.random.beta(cutmix_key, self.cutmix_alpha,
                              self.cutmix_alpha)
      kept = jnp.where(do_cutmix, 1 - box(box_key, height, width, ratio),
                       kept)
    # The targets weigh each image by the pixels it keeps: lam for mixup,
    # the area outside the box (after clipping) for cutmix.
    share = kept.mean()
    partner_images = self.partners(images)
    images = kept[None, :, :, None] * images + (
        1 - kept[None, :, :, None]) * partner_images
    targets = share * targets + (1 - share) * self.partners(targets)
    return images, targets

  def partners(self, x):
    """Each row's partner: the next row of its block, the last the first."""
    blocks = x.reshape(self.groups, x.shape[0] // self.groups, *x.shape[1:])
    return jnp.roll(blocks, -1, axis=1).reshape(x.shape)


def smooth(labels, num_classes, smoothing):
  """Integer labels [n] (or multi-hot rows) -> float32 rows [n, classes],
  smoothed: (1 - smoothing) * row + smoothing / num_classes."""
  if labels.ndim == 1:
    labels = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  labels = labels.astype(jnp.float32)
  if smoothing == 0:
    return labels
  return (1 - smoothing) * labels + smoothing / num_classes


def box(key, height, width, ratio):
  """A [height, width] float mask, 1 inside a box of area about
  (1 - ratio) * height * width centred at a uniform random pixel and
  clipped to the image, 0 elsewhere (CutMix's)."""
  side = jnp.sqrt(1 - ratio)
  box_h = jnp.floor(height * side).astype(jnp.int32)
  box_w = jnp.floor(width * side).astype(jnp.int32)
  y_key, x_key = jax.random.split(key)
  centre_y = jax.random.randint(y_key, (), 0, height)
  centre_x = jax.random.randint(x_key, (), 0, width)
  rows = jnp.arange(height)
  cols = jnp.arange(width)
  in_rows = (rows >= centre_y - box_h // 2) & (rows < centre_y + box_h -
                                                box_h // 2)
  in_cols = (cols >= centre_x - box_w // 2) & (cols < centre_x + box_w -
                                               box_w // 2)
  return (in_rows[:, None] & in_cols[None, :]).astype(jnp.float32)


def erase(images, prob, key):
  """Random erasing (the module docstring) of float images [N, H, W, C],
  each row with a key folded from `key` and its index."""
  _, height, width, _ = images.shape

  def one(image, key):
    apply_key, area_key, aspect_key, top_key, left_key, noise_key = (
        jax.random.split(key, 6))
    area = height * width * jax.random.uniform(
        area_key, (ERASE_TRIES,), minval=ERASE_AREA[0], maxval=ERASE_AREA[1])
    aspect = jnp.exp(jax.random.uniform(
        aspect_key, (ERASE_TRIES,), minval=jnp.log(ERASE_ASPECT),
        maxval=-jnp.log(ERASE_ASPECT)))
    box_h = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
    box_w = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
    fits = (box_h < height) & (box_w < width)
    first = jnp.argmax(fits)
    box_h, box_w = box_h[first], box_w[first]
    top = jax.random.randint(top_key, (), 0, height - box_h + 1)
    left = jax.random.randint(left_key, (), 0, width - box_w + 1)
    rows, cols = jnp.arange(height), jnp.arange(width)
    inside = (((rows >= top) & (rows < top + box_h))[:, None]
              & ((cols >= left) & (cols < left + box_w))[None, :])
    erased = inside & fits[first] & (jax.random.uniform(apply_key) < prob)
    noise = jax.random.normal(noise_key, image.shape, image.dtype)
    return jnp.where(erased[:, :, None], noise, image)

  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(
      jnp.arange(images.shape[0]))
  return jax.vmap(one)(images, keys)


def check(settings):
  """ConfigError naming the key, for the keys of a run's `settings` read
  here (each value's bounds: runs/settings.py)."""
  try:
    losses.check(settings.loss)
  except errors.InputError as e:
    raise errors.ConfigError.of(e, "config.loss") from e
  for name in ("mixup", "cutmix"):
    mix = getattr(settings, name)
    if mix.prob > 0 and not mix.alpha > 0:
      raise errors.ConfigError(
          f"config.{name}.alpha must be > 0 when config.{name}.prob is "
          f"set, got {mix.alpha!r} (Beta(alpha, alpha) draws the mixing "
          "ratio)")
  if settings.mixup.prob + settings.cutmix.prob > 1:
    raise errors.ConfigError(
        f"config.mixup.prob + config.cutmix.prob must be at most 1 (one draw "
        f"picks one of them per step), got {settings.mixup.prob} + "
        f"{settings.cutmix.prob}")
  recipe = Recipe.of(settings, num_classes=2)
  if settings.model.mpp and (recipe.soft or recipe.erasing_prob):
    raise errors.ConfigError(
        "masked patch prediction predicts patch colours, not labels: "
        "config.loss, label_smoothing, mixup, cutmix and random_erasing do "
        "not apply to it")
  if settings.random_erasing and (settings.naflex.max_num_patches
                                  or settings.naflex.packing):
    raise errors.ConfigError(
        "config.random_erasing erases a box of a square image: it does not "
        "apply to NaFlex or packed batches (config.naflex)")
