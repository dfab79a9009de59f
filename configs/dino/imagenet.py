"""Self-distillation as DINOv2 (Oquab et al. 2024) and facebookresearch/
dinov2 pre-train: its default recipe and its released models' settings.

  python -m vit_jax.main --config=configs/dino/imagenet.py:default \
      --workdir=DIR --config.data_dir=DATA_DIR
  python -m vit_jax.main --config=configs/dino/imagenet.py:released,L/14 \
      --workdir=DIR --config.dataset=folder:gs://BUCKET/IMAGES
  python -m vit_jax.main --config=configs/dino/imagenet.py:released,g/14 \
      --workdir=DIR --config.dataset=folder:gs://BUCKET/IMAGES

"default" is dinov2's configs/train/vitl16_short.yaml over its
ssl_default_config.yaml: ViT-L/16 on ImageNet-1k for 100 "epochs" of 1,250
steps of 2,048 images (64 on each of 32 GPUs), DINO's running center,
one head for DINO and iBOT. "released,L/14" and "released,g/14" are
vitl14.yaml and vitg14.yaml, the settings of the released backbones:
ImageNet-22k (here: any dataset, a folder of images for one), 500 epochs,
SwiGLU MLPs, Sinkhorn-Knopp, 131,072 prototypes behind a 384-wide
bottleneck, iBOT's own head, the teacher's momentum from 0.994, learning
rate 2e-4 per 1,024 images; g/14 at DINOv2's batch of 3,072 (12 on each of
256 GPUs), L/14 at 2,048. docs/dino.md has their plans (on v5p; the
default's on v6e too) and what departs from DINOv2's code.
"""

import math

from configs.imagenet import common

# dinov2's train loop counts an "epoch" as OFFICIAL_EPOCH_LENGTH steps,
# whatever the batch.
EPOCH_STEPS = 1250
USAGE = "default, released,L/14 or released,g/14"



def swiglu_hidden(width, ratio=4):
  """dinov2's SwiGLUFFNFused hidden width for an MLP of `ratio` x width:
  two thirds of it, rounded up to a multiple of 8."""
  return (int(ratio * width * 2 / 3) + 7) // 8 * 8


# ViT-g/14 (DINOv2's vit_giant2): 1536 wide, 40 blocks of 24 heads.
GIANT = dict(hidden_size=1536, num_layers=40, num_heads=24)
SWIGLU_HIDDEN = {"L/14": swiglu_hidden(1024), "g/14": swiglu_hidden(1536)}
RELEASED_BATCH = {"L/14": 2048, "g/14": 3072}


def get_config(arg=None):
  parts = (arg or "").split(",")
  if parts == ["default"]:
    return default()
  if len(parts) == 2 and parts[0] == "released" and parts[1] in (
      SWIGLU_HIDDEN):
    return released(parts[1])
  raise ValueError(f"configs/dino/imagenet.py takes {USAGE}, got {arg!r}")


def recipe(config, model, batch, epochs, base_lr, warmup_epochs,
           weight_decay_end, layer_decay, drop_path):
  """What every DINOv2 config shares (ssl_default_config.yaml)."""
  config.objective = "dino"
  config.augment = ""  # The crops and colours are the objective's.
  config.image_size = 224
  config.model.update(name=model, classifier="token", gelu="exact",
                      layer_norm_epsilon=1e-6, layer_scale=1e-5,
                      drop_path_rate=drop_path, dropout_rate=0.0)
  config.dino.update(
      local_crops=8, local_size=96 if model.endswith("/16") else 98,
      teacher_warmup_steps=30 * EPOCH_STEPS,
      freeze_prototypes_steps=1 * EPOCH_STEPS)
  config.batch_size = batch
  config.total_steps = epochs * EPOCH_STEPS
  # AdamW (0.9, 0.999), the rate scaled by sqrt(batch / 1024), a cosine
  # after the warm-up; weight decay 0.04 to its end by a cosine; clipping
  # at 3.0; the patch embedding at 0.2 of the rate.
  config.optimizer.update(
      name="adam", b1=0.9, b2=0.999,
      learning_rate=base_lr * math.sqrt(batch / 1024), decay="cosine",
      warmup_steps=warmup_epochs * EPOCH_STEPS, weight_decay=0.04,
      weight_decay_end=weight_decay_end, grad_clip_norm=3.0,
      layer_decay=layer_decay, lr_mults=(("embedding/.*", 0.2),))
  config.evaluators = dict(
      knn=dict(kind="knn", every=common.EVAL_EVERY * 5,
               datasets={"imagenet2012": (common.TRAIN_SPLIT,
                                          "validation")}))
  return config


def default():
  config = recipe(common.base_config(), "L/16", batch=2048, epochs=100,
                  base_lr=0.004, warmup_epochs=10, weight_decay_end=0.4,
                  layer_decay=0.9, drop_path=0.3)
  config.dino.update(centering="center", momentum=0.992)
  return config


def released(model):
  config = common.base_config()
  config.dataset = "imagenet2012"  # DINOv2: ImageNet-22k (LVD-142M later)
  config = recipe(config, "L/14", batch=RELEASED_BATCH[model], epochs=500,
                  base_lr=2e-4, warmup_epochs=80, weight_decay_end=0.2,
                  layer_decay=1.0, drop_path=0.4)
  config.model.update(mlp="swiglu", mlp_dim=SWIGLU_HIDDEN[model])
  if model == "g/14":
    config.model.update(**GIANT)
  config.dino.update(
      centering="sinkhorn_knopp", momentum=0.994, head_prototypes=131072,
      head_bottleneck=384, ibot_separate_head=True)
  return config
