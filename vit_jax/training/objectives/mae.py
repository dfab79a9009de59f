"""Masked autoencoders' pre-training (He et al., CVPR 2022): config.objective
"mae", config.mae's keys; the model is models/mae.py's.

Each image's patches are ranked by a noise drawn for that image from the
run's seed, the step and the image's row of the global batch (its place in
the data's stream), so a resumed run, or one on another mesh, with other
micro-batches or processes, masks what an uninterrupted one masked. The
loss is the mean squared error of the predicted pixels of the removed
patches, of their values in [-1, 1] or normalised per patch
(`norm_pix_loss`). Labels are not read.

`reconstruct(source, images, noise)` runs a source's masked autoencoder
(a workdir of an MAE run, or transformers' ViTMAEForPreTraining directory)
on images with a given noise, so its numbers can be compared with another
library's.
"""

import jax
import jax.numpy as jnp

from vit_jax import errors, models
from vit_jax.models import mae as mae_lib, naflex
from vit_jax.training.objectives import base
from vit_jax.weights import pretrained
from vit_jax.weights.pytorch import hf, mae as pytorch_mae

# Folded into the run's seed for the masks' draws: a stream of their own.
MASK_STREAM = 0x6d61736b  # "mask"
# The step whose draws mask held-out images (evaluators/loss.py).
HELD_OUT_STEP = 2 ** 31 - 1


def model_of(keys):
  """The MaskedAutoencoder of a run's Settings `keys`: config.model's
  encoder and config.mae's decoder."""
  return models.masked_autoencoder_from_settings(keys.model, keys.mae)


class MaskedAutoencoding(base.Objective):
  """Pre-training by reconstructing removed patches; no labels."""

  name = "mae"
  evaluator_kinds = ("loss", "fewshot", "knn")

  def __init__(self, keys, num_classes, frozen=None):
    del num_classes, frozen
    super().__init__(model_of(keys), keys.seed)
    self.norm_pix_loss = keys.mae.norm_pix_loss

  @classmethod
  def check(cls, keys):
    name = "config.objective='mae'"
    if not keys.mae.mask_ratio > 0:
      raise errors.ConfigError(
          f"config.mae.mask_ratio must be in (0, 1), got "
          f"{keys.mae.mask_ratio!r}")
    cls.refuse_set(name, "reconstructs images' pixels without labels, one "
                   "image a row", (
        ("config.model.mpp", keys.model.mpp, False),
        ("config.distill.teacher", keys.distill.teacher, ""),
        ("config.naflex.packing", keys.naflex.packing, False),
        ("config.mixup.prob", keys.mixup.prob, 0.0),
        ("config.cutmix.prob", keys.cutmix.prob, 0.0),
        ("config.label_smoothing", keys.label_smoothing, 0.0),
        ("config.random_erasing", keys.random_erasing, 0.0)))
    if keys.mae.decoder_hidden_size % keys.mae.decoder_num_heads:
      raise errors.ConfigError(
          f"config.mae.decoder_num_heads={keys.mae.decoder_num_heads} does "
          f"not divide decoder_hidden_size={keys.mae.decoder_hidden_size}")

  @classmethod
  def reads_labels(cls, keys):
    del keys
    return False

  def features(self, params, images):
    """The encoder's class token over every patch (MAE's linear probe
    reads it)."""
    tokens = self.model.apply({"params": params}, images,
                              method=self.model.encode)
    return tokens.values[:, 0].astype(jnp.float32)

  def prepare(self, batch, step):
    """The images (a NaFlex batch's patches and grids), and a noise [N, L]
    for each: row r of step s's batch draws from (seed, MASK_STREAM, s,
    r)."""
    return {**{key: batch[key] for key in ("image", "mask", "grid")
               if key in batch},
            "noise": self.noise(naflex.inputs_of(batch), step)}

  def noise(self, images, step):
    """[N, L] uniform draws, row r's from (seed, MASK_STREAM, step, r)."""
    if isinstance(images, naflex.Patches):
      count, num_patches = images.pixels.shape[:2]
    else:
      p = self.model.config.patch_size
      count = images.shape[0]
      num_patches = (images.shape[1] // p) * (images.shape[2] // p)
    key = self.stream(MASK_STREAM, step)
    rows = jnp.arange(count)
    return jax.vmap(lambda row: jax.random.uniform(
        jax.random.fold_in(key, row), (num_patches,)))(rows)

  def held_out(self, params, batch):
    """Each image's reconstruction loss, masked by the draws of a step no
    run takes (HELD_OUT_STEP): the same masks at every evaluation."""
    images = naflex.inputs_of(batch)
    return losses_of(self.model, params, images,
                     self.noise(images, HELD_OUT_STEP),
                     self.norm_pix_loss)[0]

  def loss(self, params, micro, weights, key):
    per_image, _, _ = losses_of(self.model, params, naflex.inputs_of(micro),
                                micro["noise"], self.norm_pix_loss,
                                dropout_key=key)
    return (weights * per_image).sum(), {}


def losses_of(model, params, images, noise, norm_pix_loss, dropout_key=None):
  """(each image's reconstruction loss [N], the predicted pixels [N, L, p *
  p * 3], the removed mask [N, L]) of a MaskedAutoencoder on `images` with
  `noise`; in training where a `dropout_key` is given."""
  train = dropout_key is not None
  predicted, removed = model.apply(
      {"params": params}, images, train=train, noise=noise,
      rngs={"dropout": dropout_key} if train else {})
  target = mae_lib.pixel_targets(images, model.config.patch_size,
                                 norm_pix_loss)
  return (mae_lib.reconstruction_losses(predicted, target, removed),
          predicted, removed)


def reconstruct_with(model, params, images, noise, norm_pix_loss):
  """(loss, reconstructions [N, L, p * p * 3], mask [N, L]) of a
  MaskedAutoencoder with `params` on `images` (NHWC, [-1, 1]) and `noise`
  [N, L]: the patches of the smallest noise are kept, as transformers'
  ViTMAEForPreTraining keeps them; mask is 1 where a patch was removed;
  the loss is the mean over removed patches (MAE's: every image removes
  as many)."""
  per_image, predicted, removed = losses_of(model, params, images, noise,
                                            norm_pix_loss)
  return per_image.mean(), predicted, removed


def reconstruct(source, images, noise):
  """(loss, reconstructions [N, L, p * p * 3], mask [N, L]) of the masked
  autoencoder in `source` (`reconstruct_with`'s), with its mask_ratio and
  norm_pix_loss: a workdir of an MAE run (DIR or DIR:STEP), or
  transformers' ViTMAEForPreTraining directory, local, a URL or
  hf://ORG/NAME (weights/pytorch/mae.py)."""
  path = pretrained.local(source).path
  if hf.is_hf_dir(path):
    model, params, norm_pix_loss = pytorch_mae.read_mae(path)
    return reconstruct_with(model, params, images, noise, norm_pix_loss)
  keys, params = base.run_of(
      source, "mae", "a transformers ViTMAEForPreTraining directory")
  return reconstruct_with(model_of(keys), params, images, noise,
                          keys.mae.norm_pix_loss)
