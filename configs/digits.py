"""The embedded default: a small ViT trained from scratch on 8x8 digits.

8 emulated CPU devices as a 4 (data) x 2 (model) mesh, so that `make train`
exercises data and tensor parallelism together.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.dataset = "digits"
  config.data_dir = ""  # "": TFDS's default (or $TFDS_DATA_DIR).
  config.train_split = "train"
  config.test_split = "test"
  config.image_size = 8
  # Comma-separated: flip, shift, inception_crop, random_crop (resize to 7/6
  # of image_size, crop back: the fine-tuning recipe). None here: a 1-pixel shift
  # of an 8x8 digit moves every 2x2 patch and slows learning more than it
  # helps; dropout regularises better (0.99 vs 0.96 test accuracy).
  config.augment = ""
  # Evaluation resizes to image_size; f < 1 resizes to image_size / f and
  # takes the central crop (0.875: 256 -> 224).
  config.eval_crop_fraction = 1.0

  # Patch 2 on 8x8 images: 16 patches + the class token.
  config.model = ml_collections.ConfigDict(dict(
      name="Ti/2", hidden_size=64, num_layers=4, mlp_dim=256, num_heads=4,
      classifier="token", representation_size=None, dropout_rate=0.1,
      attention_dropout_rate=0.0, dtype="float32"))

  config.batch_size = 128
  config.accum_steps = 1
  config.total_steps = 1000
  config.optimizer = ml_collections.ConfigDict(dict(
      name="adam", learning_rate=3e-3, warmup_steps=100, decay="cosine",
      weight_decay=1e-4, grad_clip_norm=1.0, b1=0.9, b2=0.999, momentum=0.9))

  # A checkpoint to start from: an .npz or a workdir of ours (DIR[:STEP]).
  config.init_from = ""
  config.polyak_decay = 0.0  # 0: no Polyak average of the params.

  config.mesh = ml_collections.ConfigDict(dict(data=4, fsdp=1, model=2))
  config.seed = 0
  config.log_every = 50
  config.eval_every = 250
  config.checkpoint_every = 250
  config.keep_checkpoints = 3
  return config
