"""The first principal components of a model's patch features, shown as
colours over the images (the figures of DINOv2's paper): patches whose
features agree get the same colour, so what the features tell apart
(digit from background, one part from another) shows without a label.

The components are fitted over the patches of all the images shown at
once, so a colour means the same in every image.
"""

import jax
import numpy as np

from vit_jax.models import naflex

COMPONENTS = 3  # Red, green and blue.


def patch_features(model, params, images, batch_size=8):
  """[N, rows, cols, D] float32: the encoder's output at each patch of
  square images [N, H, W, 3] (the final norm's where it norms every
  token)."""
  if isinstance(images, (naflex.Patches, naflex.Packed)):
    raise ValueError("patch components are drawn for square images only")
  apply = jax.jit(lambda batch: model.apply(
      {"params": params}, batch,
      method=lambda module, x: module.encoder(x, train=False).patches))
  out = np.concatenate([np.asarray(apply(images[i:i + batch_size]),
                                   np.float32)
                        for i in range(0, len(images), batch_size)])
  height, width = images.shape[1:3]
  stride = model.token_stride
  return out.reshape(len(images), height // stride, width // stride, -1)


def as_colours(features, count=COMPONENTS):
  """(colours [N, rows, cols, count] in [0, 1], each component's share of
  the variance): the features [N, rows, cols, D] projected on their first
  `count` principal directions, fitted over every patch of every image,
  each component scaled from its smallest to its largest value. A
  component's sign is chosen so that its largest loading is positive (a
  fit decides it, not the draw of an SVD routine)."""
  n, rows, cols, d = features.shape
  flat = features.reshape(-1, d).astype(np.float64)
  centred = flat - flat.mean(0)
  _, singular, directions = np.linalg.svd(centred, full_matrices=False)
  directions = directions[:count]
  largest = np.abs(directions).argmax(1)
  directions *= np.sign(directions[np.arange(len(directions)), largest])[
      :, None]
  projected = centred @ directions.T
  low, high = projected.min(0), projected.max(0)
  colours = (projected - low) / np.where(high > low, high - low, 1)
  variance = singular ** 2
  shares = variance[:count] / variance.sum()
  return colours.reshape(n, rows, cols, -1).astype(np.float32), shares
