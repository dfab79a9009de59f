"""Masked autoencoders on ImageNet-1k, as He et al. (CVPR 2022) and
facebookresearch/mae train them: pre-training without labels, then
fine-tuning the encoder.

  python -m vit_jax.main --config=configs/mae/imagenet.py:pretrain,B/16,800 \
      --workdir=DIR --config.data_dir=DATA_DIR
  python -m vit_jax.main --config=configs/mae/imagenet.py:finetune,B/16 \
      --workdir=DIR --config.data_dir=DATA_DIR --config.init_from=PRETRAINED
  python -m vit_jax.main --config=configs/mae/imagenet.py:linprobe,B/16 \
      --workdir=DIR --config.data_dir=DATA_DIR --config.init_from=PRETRAINED

MODEL is B/16, L/16 or H/14; pre-training runs 800 or 1600 epochs. The
paper's fine-tuned top-1 after 1600 epochs: 83.6% (B/16), 85.9% (L/16),
86.9% (H/14, at 224 px); linear probing: 68.0%, 75.8%, 76.6%.
docs/mae.md has each config's plan on v5p and v6e slices.
"""

from configs.imagenet import common
from vit_jax.training.objectives import linear_probe

MODELS = ("B/16", "L/16", "H/14")
PRETRAIN_EPOCHS = (800, 1600)

# Pre-training (the paper's appendix A.1): AdamW b1 0.9, b2 0.95, weight
# decay 0.05, base learning rate 1.5e-4 per 256 images, batch 4096, cosine
# decay after 40 warm-up epochs; random resized crops of 20-100% of the
# area and flips only; 75% of the patches removed, normalised pixels; a
# decoder 512 wide, 8 blocks, 16 heads. Torch's AdamW decays lr x wd x
# param each step, as ours does: the same 0.05.
PRETRAIN_BATCH = 4096
PRETRAIN_BASE_LR = 1.5e-4
PRETRAIN_WARMUP_EPOCHS = 40

# Fine-tuning (appendix A.2, facebookresearch/mae's FINETUNE.md): batch
# 1024, base lr per 256 images, layer decay, drop path, weight decay 0.05,
# 5 warm-up epochs, RandAugment (9, 0.5), random erasing 0.25, Mixup 0.8
# and CutMix 1.0 (timm's: one of them each batch, half and half), label
# smoothing 0.1.
FINETUNE_BATCH = 1024
FINETUNE = {  # base lr, layer decay, drop path, epochs
    "B": (5e-4, 0.65, 0.1, 100),
    "L": (1e-3, 0.75, 0.2, 50),
    "H": (1e-3, 0.75, 0.3, 50),
}
FINETUNE_WARMUP_EPOCHS = 5
RANDOM_ERASING = 0.25
# Linear probing (appendix A.3, LINPROBE.md): the frozen encoder's class
# token through a batch norm without scale or bias, then the head; LARS,
# momentum 0.9, no weight decay, base lr 0.1 per 256 images, batch 16,384,
# 10 warm-up epochs of 90, cosine; random resized crops and flips only.
PROBE_BATCH = 16384
PROBE_BASE_LR = 0.1
PROBE_EPOCHS = 90
PROBE_WARMUP_EPOCHS = 10
USAGE = ("pretrain,MODEL,EPOCHS, finetune,MODEL or linprobe,MODEL with "
         "MODEL one of "
         + ", ".join(MODELS) + " and EPOCHS one of "
         + ", ".join(map(str, PRETRAIN_EPOCHS)))


def get_config(arg=None):
  parts = (arg or "").split(",")
  kind, model = (parts + ["", ""])[:2]
  if model not in MODELS or not (
      (kind == "pretrain" and len(parts) == 3
       and parts[2] in map(str, PRETRAIN_EPOCHS))
      or (kind in ("finetune", "linprobe") and len(parts) == 2)):
    raise ValueError(f"configs/mae/imagenet.py takes {USAGE}, got {arg!r}")
  config = common.base_config()
  # MAE's ViT: torch's exact GELU and LayerNorm epsilon 1e-6, fixed sin-cos
  # positions, a class token.
  config.model.update(name=model, classifier="token", gelu="exact",
                      layer_norm_epsilon=1e-6)
  if kind == "pretrain":
    return pretrain(config, int(parts[2]))
  if kind == "linprobe":
    return linprobe(config)
  return finetune(config, model)


def pretrain(config, epochs):
  config.objective = "mae"
  config.model.posemb = "sincos2d"
  config.mae.update(mask_ratio=0.75, norm_pix_loss=True,
                    decoder_hidden_size=512, decoder_num_layers=8,
                    decoder_num_heads=16, decoder_mlp_dim=2048)
  config.augment = "mae_crop,flip"
  config.batch_size = PRETRAIN_BATCH
  config.total_steps = common.total_steps(epochs, PRETRAIN_BATCH)
  config.optimizer.update(
      name="adam", learning_rate=PRETRAIN_BASE_LR * PRETRAIN_BATCH / 256,
      b1=0.9, b2=0.95, weight_decay=0.05, decay="cosine",
      warmup_steps=common.total_steps(PRETRAIN_WARMUP_EPOCHS, PRETRAIN_BATCH))
  config.evaluators = dict(
      minival=dict(kind="loss", every=common.EVAL_EVERY,
                   split=common.MINIVAL_SPLIT))
  return config


def finetune(config, model):
  base_lr, layer_decay, drop_path, epochs = FINETUNE[model[0]]
  config.model.drop_path_rate = drop_path
  config.augment = "inception_crop,flip"
  config.randaugment = "2,9"
  config.random_erasing = RANDOM_ERASING
  config.mixup.update(prob=0.5, alpha=0.8)
  config.cutmix.update(prob=0.5, alpha=1.0)
  config.label_smoothing = 0.1
  config.batch_size = FINETUNE_BATCH
  config.total_steps = common.total_steps(epochs, FINETUNE_BATCH)
  config.optimizer.update(
      name="adam", learning_rate=base_lr * FINETUNE_BATCH / 256, b1=0.9,
      b2=0.999, weight_decay=0.05, layer_decay=layer_decay, decay="cosine",
      warmup_steps=common.total_steps(FINETUNE_WARMUP_EPOCHS,
                                      FINETUNE_BATCH))
  return config


def linprobe(config):
  config.objective = "linear_probe"
  config.augment = "inception_crop,flip"
  config.batch_size = PROBE_BATCH
  config.total_steps = common.total_steps(PROBE_EPOCHS, PROBE_BATCH)
  config.optimizer.update(
      name="lars", learning_rate=PROBE_BASE_LR * PROBE_BATCH / 256,
      momentum=0.9, weight_decay=0.0, decay="cosine",
      frozen=linear_probe.PROBE_FROZEN,
      warmup_steps=common.total_steps(PROBE_WARMUP_EPOCHS, PROBE_BATCH))
  return config
