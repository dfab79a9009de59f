"""DINOv2's multi-crop augmentation (Oquab et al. 2023), on the device.

Self-distillation shows the teacher a few large ("global") crops of each
image and the student those and many small ("local") ones. DINOv2 makes
them on the host with torchvision on PIL images (DataAugmentationDINO in
dinov2/data/augmentations.py); here the whole global batch of uint8 images
[N, H, W, 3] goes to the device once and the crops are made there, inside
the jitted step, so the host sends one image instead of ten crops.

Each crop, in this order (the probabilities and ranges are the module's
constants, each the default of a CropSpec field):
  crop      torchvision's RandomResizedCrop: a box of a share of the
            image's area drawn from the spec's scale range and an aspect
            ratio log-uniform in [3/4, 4/3] (the first of 10 draws that
            fits, else the central crop), resized to the crop's size with
            antialiased bicubic interpolation (PIL's BICUBIC, Keys' cubic
            with a = -0.5, widened when shrinking). See `crop_box` and
            `resized_crop`.
  flip      left-right with probability 0.5.
  jitter    with probability 0.8, brightness, contrast, saturation (each
            a factor uniform in [1 - x, 1 + x]) and hue (a shift uniform
            in [-0.1, 0.1] of a turn), in a random order, as torchvision's
            ColorJitter defines each on [0, 1] (`brightness`, `contrast`,
            `saturation`, `hue`).
  grey      with probability 0.2, ITU-R 601-2 luma into all three channels.
  blur      a 9-tap Gaussian (sigma uniform in [0.1, 2.0], reflected at the
            edges), with probability 1.0 on global crop 0, 0.1 on global
            crop 1, 0.5 on local crops.
  solarise  1 - x where x >= 0.5, with probability 0.2, global crop 1 only.
With more than two global crops, crop i takes crop i % 2's blur and
solarisation, so the two recipes stay equally often in the teacher's view.

Randomness: row r of the batch draws from fold_in(key, r) only, and its
crop c (global crops 0.., then the local ones after them) from a fold_in of
that by c, as `targets.erase` does: a row's draws do not depend on how the
batch is split over devices or processes, nor on the other rows. (Its
pixels, to float32 rounding: XLA's kernels for a device's share of rows
may round otherwise than those for the whole batch.)

Departures from DINOv2, each for a reason:
  - The crops come out in [-1, 1] (x / 127.5 - 1 of the 0-255 values), not
    normalised by ImageNet's mean and standard deviation: this project's
    models and checkpoints take [-1, 1].
  - The values stay float from the resize on. PIL rounds to uint8 after
    the resize and after each colour op (hue in steps of 1/256 of a turn;
    contrast blends with the greyscale mean rounded to an integer). The
    solarisation threshold 0.5 is where PIL's rounding puts 128 / 255.
  - The crops are cut from the images the input pipeline delivers (square,
    already resized), not from the decoded original.
  - DINOv2's released code passes 1 - p to torchvision's RandomApply
    (dinov2/data/transforms.py, GaussianBlur), so it actually blurs global
    crop 0 never and global crop 1 with probability 0.9 (dinov2 pull
    request 411). The defaults here are the probabilities as DINOv2 names
    them (and DINO and BYOL use); CropSpec(global_blur_prob=(0.0, 0.9))
    is the released code's behaviour.
  - The 10 crop draws are made at once and the first that fits is kept
    (the same distribution as torchvision's loop).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

from vit_jax.runs import settings as settings_lib

# DINOv2's DataAugmentationDINO (dinov2/data/augmentations.py), its
# defaults (dinov2/configs/ssl_default_config.yaml: crops.global_crops_scale,
# local_crops_scale, local_crops_number, global_crops_size,
# local_crops_size).
# Declared once, as config.dino's keys (runs/settings.py); read here.
_DINO = {field.name: field.default
         for field in dataclasses.fields(settings_lib.DINO)}
GLOBAL_SCALE = _DINO["global_scale"]
LOCAL_SCALE = _DINO["local_scale"]
# torchvision's RandomResizedCrop: its default aspect ratios and tries.
RATIO = (3 / 4, 4 / 3)
CROP_TRIES = 10
# DINOv2: RandomHorizontalFlip(p=0.5), then RandomApply([ColorJitter(
# brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)], p=0.8), then
# RandomGrayscale(p=0.2).
FLIP_PROB = _DINO["flip_probability"]
JITTER_PROB = _DINO["jitter_probability"]
BRIGHTNESS = 0.4
CONTRAST = 0.4
SATURATION = 0.2
HUE = 0.1
GREY_PROB = _DINO["grey_probability"]
# ITU-R 601-2 luma, as PIL's convert("L") weighs R, G, B.
LUMA = (0.299, 0.587, 0.114)
# DINOv2: GaussianBlur(p=1.0) on global crop 0, GaussianBlur(p=0.1) on
# global crop 1, GaussianBlur(p=0.5) on local crops, each torchvision's
# GaussianBlur(kernel_size=9, sigma=(0.1, 2.0)); RandomSolarize(threshold=
# 128, p=0.2) on global crop 1 only. (The released code's blur
# probabilities differ: the module docstring.)
GLOBAL_BLUR_PROB = _DINO["global_blur_probability"]
LOCAL_BLUR_PROB = _DINO["local_blur_probability"]
BLUR_KERNEL = 9
BLUR_SIGMA = _DINO["blur_sigma"]
GLOBAL_SOLARIZE_PROB = _DINO["global_solarize_probability"]
# 128 on the 0-255 scale: on [0, 1], where PIL's rounding to uint8 puts it.
SOLARIZE_THRESHOLD = 0.5


@dataclasses.dataclass(frozen=True)
class CropSpec:
  """How many crops of each kind, their sizes in pixels, their scale
  ranges (shares of the image's area) and how often each op applies.
  The defaults are DINOv2's. Global crop i takes the blur and solarisation
  probabilities at i % 2 of the global_* pairs."""
  num_global: int = 2
  global_size: int = 224
  global_scale: tuple = GLOBAL_SCALE
  num_local: int = _DINO["local_crops"]
  local_size: int = _DINO["local_size"]
  local_scale: tuple = LOCAL_SCALE
  ratio: tuple = RATIO
  flip_prob: float = FLIP_PROB
  jitter_prob: float = JITTER_PROB
  grey_prob: float = GREY_PROB
  global_blur_prob: tuple = GLOBAL_BLUR_PROB
  local_blur_prob: float = LOCAL_BLUR_PROB
  global_solarize_prob: tuple = GLOBAL_SOLARIZE_PROB
  # In pixels, as torchvision's GaussianBlur draws it: DINOv2's range is
  # for 224-px crops (a small image's crops want it scaled with them).
  blur_sigma: tuple = BLUR_SIGMA


def multi_crop(images, key, spec):
  """(global crops [N, num_global, global_size, global_size, 3], local
  crops [N, num_local, local_size, local_size, 3]), float32 in [-1, 1], of
  uint8 images [N, H, W, 3] (values 0-255), row r drawn from
  fold_in(key, r) (the module docstring). [-1, 1], not DINOv2's ImageNet
  mean and standard deviation: the project's models and checkpoints take
  [-1, 1]."""
  images = images.astype(jnp.float32) / 255

  def crops(image, row_key, first, count, size, scale, blur, solarize):
    if count == 0:
      return jnp.zeros((0, size, size, 3), jnp.float32)
    keys = jax.vmap(lambda c: jax.random.fold_in(row_key, c))(
        jnp.arange(first, first + count))
    return jax.vmap(
        lambda k, b, s: augment(image, k, size, scale, b, s, spec))(
            keys, jnp.asarray(blur, jnp.float32),
            jnp.asarray(solarize, jnp.float32))

  def row(image, row_key):
    pick = [i % 2 for i in range(spec.num_global)]
    global_crops = crops(
        image, row_key, 0, spec.num_global, spec.global_size,
        spec.global_scale, [spec.global_blur_prob[i] for i in pick],
        [spec.global_solarize_prob[i] for i in pick])
    local_crops = crops(
        image, row_key, spec.num_global, spec.num_local, spec.local_size,
        spec.local_scale, [spec.local_blur_prob] * spec.num_local,
        [0.0] * spec.num_local)
    return global_crops, local_crops

  row_keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(
      jnp.arange(images.shape[0]))
  global_crops, local_crops = jax.vmap(row)(images, row_keys)
  # [0, 1] -> [-1, 1]: x / 127.5 - 1 of the 0-255 values.
  return global_crops * 2 - 1, local_crops * 2 - 1


def augment(image, key, size, scale, blur_prob, solarize_prob, spec):
  """One crop [size, size, 3] in [0, 1] of a float image [H, W, 3] in
  [0, 1]: crop, flip, jitter, grey, blur, solarise (the module docstring).
  `blur_prob` and `solarize_prob` may be traced."""
  (box_key, flip_key, jitter_key, jitter_draws, grey_key, blur_key,
   sigma_key, solarize_key) = jax.random.split(key, 8)
  height, width = image.shape[:2]
  x = resized_crop(image, crop_box(box_key, height, width, scale,
                                   spec.ratio), size)
  x = jnp.where(jax.random.bernoulli(flip_key, spec.flip_prob),
                x[:, ::-1], x)
  x = jnp.where(jax.random.bernoulli(jitter_key, spec.jitter_prob),
                colour_jitter(x, jitter_draws), x)
  x = jnp.where(jax.random.bernoulli(grey_key, spec.grey_prob),
                greyscale(x), x)
  sigma = jax.random.uniform(sigma_key, minval=spec.blur_sigma[0],
                             maxval=spec.blur_sigma[1])
  x = jnp.where(jax.random.bernoulli(blur_key, blur_prob), blur(x, sigma), x)
  return jnp.where(jax.random.bernoulli(solarize_key, solarize_prob),
                   solarize(x), x)


def crop_box(key, height, width, scale, ratio=RATIO):
  """(top, left, crop height, crop width), int32 scalars: torchvision's
  RandomResizedCrop box of an image of static `height` x `width`. Of
  CROP_TRIES draws of an area (a share of the image's uniform in `scale`)
  and an aspect ratio w / h (log-uniform in `ratio`), with w and h rounded,
  the first that fits the image, at a uniform integer position; if none
  fits, the largest central box of an aspect ratio within `ratio`."""
  area_key, ratio_key, top_key, left_key = jax.random.split(key, 4)
  area = height * width * jax.random.uniform(
      area_key, (CROP_TRIES,), minval=scale[0], maxval=scale[1])
  aspect = jnp.exp(jax.random.uniform(
      ratio_key, (CROP_TRIES,), minval=math.log(ratio[0]),
      maxval=math.log(ratio[1])))
  crop_w = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
  crop_h = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
  fits = (crop_w > 0) & (crop_w <= width) & (crop_h > 0) & (crop_h <= height)
  first = jnp.argmax(fits)
  # The fallback depends on the static shape only: worked out in Python.
  if width / height < min(ratio):
    central_w, central_h = width, round(width / min(ratio))
  elif width / height > max(ratio):
    central_w, central_h = round(height * max(ratio)), height
  else:
    central_w, central_h = width, height
  crop_h = jnp.where(fits[first], crop_h[first], central_h)
  crop_w = jnp.where(fits[first], crop_w[first], central_w)
  top = jnp.where(fits[first],
                  jax.random.randint(top_key, (), 0, height - crop_h + 1),
                  (height - central_h) // 2)
  left = jnp.where(fits[first],
                   jax.random.randint(left_key, (), 0, width - crop_w + 1),
                   (width - central_w) // 2)
  return top, left, crop_h, crop_w


def resized_crop(image, box, size):
  """The `box` (top, left, height, width; may be traced) of a float image
  [H, W, C], resized to [size, size, C] with antialiased bicubic
  interpolation and clipped to [0, 1]: as PIL crops, then resizes.

  jax.image.scale_and_translate maps the box onto the output, but its
  taps at the box's edges would read the pixels just outside it, where
  PIL's, on the crop alone, are renormalised over the crop's pixels. Its
  weights are normalised over the whole image, so resizing image * mask
  and dividing by the resized mask (1 in the box) renormalises them over
  the box: sum_box w x / sum_box w, exactly the crop's resize."""
  top, left, crop_h, crop_w = box
  height, width = image.shape[:2]
  scale = size / jnp.stack([crop_h, crop_w]).astype(jnp.float32)
  translation = -jnp.stack([top, left]).astype(jnp.float32) * scale
  rows = jnp.arange(height)
  cols = jnp.arange(width)
  mask = (((rows >= top) & (rows < top + crop_h))[:, None, None]
          & ((cols >= left) & (cols < left + crop_w))[None, :, None])
  mask = mask.astype(jnp.float32)

  def resize(x):
    return jax.image.scale_and_translate(
        x, (size, size, x.shape[-1]), (0, 1), scale, translation,
        method="cubic", antialias=True)

  # PIL clips the cubic's overshoot when it rounds to uint8.
  return jnp.clip(resize(image * mask) / resize(mask), 0, 1)


def colour_jitter(image, key):
  """torchvision's ColorJitter(BRIGHTNESS, CONTRAST, SATURATION, HUE) of
  a float image [H, W, 3] in [0, 1]: four factors drawn, the four ops in
  a random order."""
  factor_key, order_key = jax.random.split(key)
  lows = jnp.array([1 - BRIGHTNESS, 1 - CONTRAST, 1 - SATURATION, -HUE])
  highs = jnp.array([1 + BRIGHTNESS, 1 + CONTRAST, 1 + SATURATION, HUE])
  factors = jax.random.uniform(factor_key, (4,), minval=lows, maxval=highs)
  ops = (brightness, contrast, saturation, hue)
  branches = [lambda x, i=i: ops[i](x, factors[i]) for i in range(4)]
  order = jax.random.permutation(order_key, 4)
  for slot in range(4):
    image = jax.lax.switch(order[slot], branches, image)
  return image


def brightness(image, factor):
  """torchvision's adjust_brightness on [0, 1]: scaled, clipped."""
  return jnp.clip(image * factor, 0, 1)


def contrast(image, factor):
  """torchvision's adjust_contrast on [0, 1]: blended with the mean of
  the greyscale image, clipped."""
  mean = luma(image).mean()
  return jnp.clip(factor * image + (1 - factor) * mean, 0, 1)


def saturation(image, factor):
  """torchvision's adjust_saturation on [0, 1]: blended with the
  greyscale image, clipped."""
  grey = luma(image)[..., None]
  return jnp.clip(factor * image + (1 - factor) * grey, 0, 1)


def hue(image, shift):
  """torchvision's adjust_hue on [0, 1]: the hue in HSV turned by `shift`
  (a share of a full turn, in [-0.5, 0.5]); saturation and value kept."""
  red, green, blue = image[..., 0], image[..., 1], image[..., 2]
  value = image.max(-1)
  chroma = value - image.min(-1)
  safe_chroma = jnp.where(chroma > 0, chroma, 1)
  # The hue in sixths of a turn, by the formula of the largest channel.
  # Picked by argmax, not by `value == red`: XLA may compute a value twice
  # (once per consumer), rounding each copy its own way (a fused multiply-
  # add in one), and then no channel equals the max. The formulas agree
  # where two channels tie, so a pick off by a rounding is off by as much.
  largest = jnp.argmax(image, axis=-1)
  sixths = jnp.select(
      [largest == 0, largest == 1],
      [((green - blue) / safe_chroma) % 6, (blue - red) / safe_chroma + 2],
      (red - green) / safe_chroma + 4)
  sixths = jnp.where(chroma > 0, sixths, 0)
  sixths = (sixths + 6 * shift) % 6
  # Back to RGB: each channel is value less chroma where the hue is over
  # a sixth away from the channel's own (red 0, green 2, blue 4 sixths),
  # ramping to the full value within a sixth of it.
  channels = []
  for offset in (5, 3, 1):
    k = (offset + sixths) % 6
    channels.append(value - chroma * jnp.clip(jnp.minimum(k, 4 - k), 0, 1))
  return jnp.stack(channels, -1)


def luma(image):
  """The greyscale [H, W] of an RGB image [H, W, 3]: LUMA's weights.
  A weighted sum, not a dot: a TPU's default dot precision may round the
  float32 channels to bfloat16."""
  return sum(weight * image[..., c] for c, weight in enumerate(LUMA))


def greyscale(image):
  """torchvision's RandomGrayscale's op: luma into all three channels."""
  return jnp.repeat(luma(image)[..., None], 3, axis=-1)


def blur(image, sigma):
  """torchvision's gaussian_blur of an [H, W, C] image: a BLUR_KERNEL-tap
  Gaussian of standard deviation `sigma` (may be traced), separable, the
  image reflected at its edges (torchvision pads with "reflect")."""
  half = BLUR_KERNEL // 2
  offsets = jnp.arange(-half, half + 1, dtype=jnp.float32)
  weights = jnp.exp(-0.5 * (offsets / sigma) ** 2)
  weights = weights / weights.sum()
  height, width = image.shape[:2]
  padded = jnp.pad(image, ((half, half), (half, half), (0, 0)),
                   mode="reflect")
  columns = sum(weights[k] * padded[k:k + height]
                for k in range(BLUR_KERNEL))
  return sum(weights[k] * columns[:, k:k + width] for k in range(BLUR_KERNEL))


def solarize(image):
  """torchvision's solarize at 128 of 255, on [0, 1]: 1 - x where
  x >= SOLARIZE_THRESHOLD."""
  return jnp.where(image >= SOLARIZE_THRESHOLD, 1 - image, image)
