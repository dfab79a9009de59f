"""What a masked autoencoder's run (config.objective "mae") makes of
held-out images: each image, its visible patches, the decoder's
reconstruction of the rest, and the two together, as He et al.'s figures
show them (vit_jax.figures draws them: plots.reconstructions).

The masks are drawn from `seed` (numpy), a quarter kept at the paper's
ratio; with norm_pix_loss the decoder predicts each patch normalised by
its own mean and variance, which the picture takes back from the image's
own patch (as MAE's visualisation does).
"""

import numpy as np

from vit_jax.models import mae as mae_lib
from vit_jax.runs import workdir as workdir_lib
from vit_jax.training.objectives import mae as mae_objective
from vit_jax.weights import pretrained


def is_mae_run(workdir):
  run = workdir_lib.Workdir(workdir)
  return run.has_run() and run.read_config().objective == "mae"


def of_run(workdir, images, seed=0):
  """(pictures [4, N, H, W, 3] uint8: the images, their visible patches on
  grey, the reconstruction, the reconstruction with the visible patches
  pasted in; each image's loss [N]) of the MAE run in `workdir` on uint8
  square `images` [N, H, W, 3]."""
  keys = workdir_lib.Workdir(workdir).read_config()
  model = mae_objective.model_of(keys)
  patch = model.config.patch_size
  unit = np.asarray(images, np.float32) / 127.5 - 1
  n, height, width, _ = unit.shape
  num_patches = (height // patch) * (width // patch)
  noise = np.random.default_rng(seed).random((n, num_patches)).astype(
      np.float32)
  params, _ = pretrained.load_run(workdir)
  per_image, predicted, removed = mae_objective.losses_of(
      model, params, unit, noise, keys.mae.norm_pix_loss)
  original = np.asarray(mae_lib.patchify(unit, patch))
  predicted = np.asarray(predicted)
  if keys.mae.norm_pix_loss:
    mean = original.mean(axis=-1, keepdims=True)
    std = np.sqrt(original.var(axis=-1, ddof=1, keepdims=True) + 1e-6)
    predicted = predicted * std + mean
  removed = np.asarray(removed)[..., None]
  grey = np.zeros_like(original)
  rows = [original, original * (1 - removed) + grey * removed, predicted,
          original * (1 - removed) + predicted * removed]
  pictures = np.stack([unpatchify(row, patch, height, width) for row in rows])
  return (np.clip(np.round((pictures + 1) * 127.5), 0, 255).astype(np.uint8),
          np.asarray(per_image))


def unpatchify(patches, patch, height, width):
  """[N, L, p * p * 3] (mae.patchify's order) -> [N, H, W, 3]."""
  n = patches.shape[0]
  rows, cols = height // patch, width // patch
  return patches.reshape(n, rows, cols, patch, patch, 3).transpose(
      0, 1, 3, 2, 4, 5).reshape(n, height, width, 3)
