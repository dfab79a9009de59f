"""What configs/table2/pretrain.py and finetune.py share: the key set, the
pre-training data sources, and the argument parsing.

The numbers of the paper sit in pretrain.py (Table 3) and finetune.py
(Table 4, Table 2's fine-tuning notes); this module holds none of them.
"""

import ml_collections

# Pre-training data, by the short name the arguments use. Neither is in the
# TFDS catalog (tensorflow_datasets 4.9.10 has no jft* nor imagenet21k*
# builder): each is read from TFDS files prepared in config.data_dir, as
# DATA_DIR/<tfds name>/<version>/ (what `tfds build` or
# `tfds.folder_dataset.write_metadata` writes; an "image" and a "label"
# ClassLabel feature). The TFDS name is the argument's optional third field.
SOURCES = {
    # JFT-300M is Google-internal; "jft300m" is only our default name.
    "jft": "jft300m",
    # "imagenet21k" is the name big_vision's configs use for Google's own,
    # unpublished TFDS build of ImageNet-21k (fall 2011 release).
    "i21k": "imagenet21k",
}


def base_config():
  """Every key of configs/digits.py, none of them a paper number yet.

  `model` carries no sizes: they come from its name ("L/16" -> Table 1).
  """
  config = ml_collections.ConfigDict()
  config.dataset = ""
  config.data_dir = ""  # "": TFDS's default (or $TFDS_DATA_DIR).
  config.train_split = "train"
  config.test_split = "test"
  config.image_size = 0
  config.augment = ""
  config.eval_crop_fraction = 1.0
  config.model = ml_collections.ConfigDict(dict(
      name="", classifier="token", representation_size=None,
      dropout_rate=0.0, attention_dropout_rate=0.0,
      # float32 params, bfloat16 compute: the TPU setting.
      dtype="bfloat16"))
  config.batch_size = 0
  config.accum_steps = 1  # Raise it where a batch does not fit in memory.
  config.total_steps = 0
  config.optimizer = ml_collections.ConfigDict(dict(
      name="", learning_rate=0.0, warmup_steps=0, decay="", weight_decay=0.0,
      grad_clip_norm=0.0, b1=0.9, b2=0.999, momentum=0.9))
  config.init_from = ""
  config.polyak_decay = 0.0
  # Pure data parallelism over every device, as in the paper; a model that
  # does not fit can use --config.mesh.fsdp=N (data then takes the rest).
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1))
  config.seed = 0
  config.log_every = 100
  config.eval_every = 1000
  config.checkpoint_every = 1000
  config.keep_checkpoints = 3
  return config


def fields(arg, config_file, usage, min_fields, max_fields):
  """"a,b,c" -> ["a", "b", "c"], or a ValueError that shows the usage."""
  parts = [] if not arg else [part.strip() for part in arg.split(",")]
  if not min_fields <= len(parts) <= max_fields or not all(parts):
    raise ValueError(f"{config_file} takes {usage}, got {arg!r}")
  return parts
