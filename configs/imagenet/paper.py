"""The paper's pre-training on ImageNet-1k (Figure 3; Table 3's ImageNet
row; Section 4.2).

  python -m vit_jax.main --config=configs/imagenet/paper.py:MODEL \
      --workdir=DIR --config.data_dir=DATA_DIR

MODEL is one of Figure 3's ViTs pre-trained on ImageNet: B/32, B/16, L/32,
L/16. ImageNet-1k is TFDS imagenet2012, prepared in DATA_DIR (its images
are a manual download); the ReaL and v2 evaluations need imagenet2012_real
and imagenet_v2 there too (--config.evaluators.real.every=0 and
--config.evaluators.v2.every=0 leave them out). Figure 3 reports these
models fine-tuned on ImageNet, which configs/table2/finetune.py's recipe
does from this run's workdir (init_from=DIR).
"""

from configs.imagenet import common

MODELS = ("B/32", "B/16", "L/32", "L/16")
# Table 3, ImageNet row: 300 epochs, base lr 3e-3, cosine decay, weight
# decay 0.3, dropout 0.1; all of Table 3: Adam (b1 0.9, b2 0.999), batch
# 4096, linear warm-up over 10k steps, 224 px; ImageNet-1k's runs alone
# clip gradients at global norm 1. The weight decay is decoupled and
# scaled by the learning rate, as in configs/table2/pretrain.py.
EPOCHS = 300
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.3
DROPOUT = 0.1
BATCH_SIZE = 4096
WARMUP_STEPS = 10_000
GRAD_CLIP_NORM = 1.0
# Section 4.2: on ImageNet the models are regularised by "weight decay,
# dropout, and label smoothing". The paper gives no value for the last;
# 0.1 is the value label smoothing was introduced with (Szegedy et al.
# 2016) and the usual one.
LABEL_SMOOTHING = 0.1
# Pre-training keeps the head's hidden tanh layer, D wide (Section 3.1).
REPRESENTATION_SIZES = {"B": 768, "L": 1024}
USAGE = "MODEL, one of " + ", ".join(MODELS)


def get_config(arg=None):
  if arg not in MODELS:
    raise ValueError(f"configs/imagenet/paper.py takes {USAGE}, got {arg!r}")
  config = common.base_config()
  config.model.update(name=arg, representation_size=REPRESENTATION_SIZES[
      arg[0]], dropout_rate=DROPOUT)
  config.label_smoothing = LABEL_SMOOTHING
  config.batch_size = BATCH_SIZE
  config.total_steps = common.total_steps(EPOCHS, BATCH_SIZE)
  config.optimizer.update(
      name="adam", learning_rate=LEARNING_RATE, warmup_steps=WARMUP_STEPS,
      decay="cosine", weight_decay=WEIGHT_DECAY,
      grad_clip_norm=GRAD_CLIP_NORM, b1=0.9, b2=0.999)
  return config
