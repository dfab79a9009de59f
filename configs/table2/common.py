"""What configs/table2/pretrain.py and finetune.py share: the key set, the
pre-training data sources, and the argument parsing.

The numbers of the paper sit in pretrain.py (Table 3) and finetune.py
(Table 4, Table 2's fine-tuning notes); this module holds none of them.
"""

from configs import base

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
  """configs/base.py with the TPU setting, none of it a paper number yet.

  `model` carries no sizes: they come from its name ("L/16" -> Table 1).
  """
  config = base.get_config()
  config.model.dtype = "bfloat16"  # float32 params, bfloat16 compute.
  # How the step is laid out on a slice, which changes no result; what
  # `python -m vit_jax.plan` found best (docs/plan.md).
  # Scanned blocks: one block compiled, half a minute instead of minutes
  # for H/14's 32. FSDP over 8 cores, which divides every v3 slice: each
  # core keeps and updates an 8th of the params and optimizer state, which
  # for H/14 at 8 images per core takes its MFU from 63% to 70%.
  config.model.scan_layers = True
  config.mesh.fsdp = 8
  return config


def fields(arg, config_file, usage, min_fields, max_fields):
  """"a,b,c" -> ["a", "b", "c"], or a ValueError that shows the usage."""
  parts = [] if not arg else [part.strip() for part in arg.split(",")]
  if not min_fields <= len(parts) <= max_fields or not all(parts):
    raise ValueError(f"{config_file} takes {usage}, got {arg!r}")
  return parts
