"""What configs/imagenet/paper.py and plain.py share: ImageNet-1k's splits,
its size, the evaluations, and the epochs-to-steps rule.

ImageNet-1k is TFDS "imagenet2012" (manual download, prepared in
config.data_dir); ReaL's labels are "imagenet2012_real", ImageNet-v2 is
"imagenet_v2". The numbers of the papers sit in paper.py and plain.py.
"""

import math

from configs.table2 import common

# TFDS imagenet2012: 1,281,167 training and 50,000 validation images.
TRAIN_IMAGES = 1_281_167
# 1% of the train split held out to pick settings by, as big_vision's
# ImageNet configs do ("train[:99%]" / "train[99%:]"); TFDS rounds the
# boundary to the nearest image.
MINIVAL_PERCENT = 1
TRAIN_SPLIT = f"train[:{100 - MINIVAL_PERCENT}%]"
MINIVAL_SPLIT = f"train[{100 - MINIVAL_PERCENT}%:]"
TRAIN_SPLIT_IMAGES = round(TRAIN_IMAGES * (100 - MINIVAL_PERCENT) / 100)
IMAGE_SIZE = 224
# Evaluation resizes to 256 and takes the central 224 (big_vision's
# resize_small(256)|central_crop(224) keeps the aspect ratio where this
# squares the image first: vit_jax/data/preprocess.py eval_resize).
EVAL_CROP_FRACTION = 0.875
EVAL_EVERY = 2_500


def total_steps(epochs, batch_size):
  """ceil(epochs * images / batch): every epoch's images seen."""
  return math.ceil(epochs * TRAIN_SPLIT_IMAGES / batch_size)


def base_config():
  """The TPU settings (configs/table2/common.py) and ImageNet's data and
  evaluations: minival, validation, ReaL and ImageNet-v2 top-1."""
  config = common.base_config()
  config.dataset = "imagenet2012"
  config.train_split = TRAIN_SPLIT
  config.image_size = IMAGE_SIZE
  config.augment = "inception_crop,flip"
  config.eval_crop_fraction = EVAL_CROP_FRACTION
  config.log_every = 100
  config.checkpoint_every = 2_500
  config.evaluators = dict(
      minival=dict(kind="accuracy", every=EVAL_EVERY, split=MINIVAL_SPLIT),
      val=dict(kind="accuracy", every=EVAL_EVERY, split="validation"),
      real=dict(kind="real", every=EVAL_EVERY, dataset="imagenet2012_real",
                split="validation"),
      v2=dict(kind="accuracy", every=EVAL_EVERY, dataset="imagenet_v2",
              split="test"))
  return config
