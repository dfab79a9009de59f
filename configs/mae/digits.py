"""Masked autoencoders on the digits, then learning from 10 labels a class.

  python -m vit_jax.main --config=configs/mae/digits.py:pretrain --workdir=workdir/mae/pretrain
  python -m vit_jax.main --config=configs/mae/digits.py:finetune --workdir=workdir/mae/finetune
  python -m vit_jax.main --config=configs/mae/digits.py:scratch --workdir=workdir/mae/scratch
  python -m vit_jax.main --config=configs/mae/digits.py:probe --workdir=workdir/mae/probe

"pretrain" reconstructs the 1,437 training digits' removed patches (3 of
4 of each image's 16 patches of 2x2 pixels) without reading a label, its
held-out reconstruction loss and few-shot accuracy logged as it goes.
"finetune" starts from its encoder and learns the digits from
`digits/10_per_class`, the first 10 training images of each digit; "scratch"
learns the same from random weights, with the same steps, batch and
recipe. "probe" trains a linear head on the frozen encoder's class token
from every training label (MAE's linear probe: a batch norm without scale
or bias, then the head, by LARS). docs/mae.md has the table (3 seeds;
`make mae` runs one).
"""

from configs import digits
from vit_jax.training.objectives import linear_probe

# What pre-training and fine-tuning share: the digits model (Ti/2 shrunk).
PRETRAIN_STEPS = 2000
PROBE_STEPS = 300


def get_config(arg="pretrain"):
  config = digits.get_config()
  config.model.posemb = "sincos2d"  # MAE's encoder: fixed 2-D sin-cos.
  config.model.dropout_rate = 0.0
  if arg == "pretrain":
    config.objective = "mae"
    config.mae.update(mask_ratio=0.75, norm_pix_loss=True,
                      decoder_hidden_size=64, decoder_num_layers=2,
                      decoder_num_heads=4, decoder_mlp_dim=256)
    config.total_steps = PRETRAIN_STEPS
    # MAE's recipe, scaled down: AdamW with b2 0.95 and weight decay 0.05,
    # a cosine decay after a warm-up of 5% of the steps.
    config.optimizer.update(name="adam", learning_rate=1e-3, b2=0.95,
                            weight_decay=0.05, warmup_steps=100,
                            decay="cosine", grad_clip_norm=0.0)
    config.evaluators = {
        "test": {"kind": "loss", "every": 500, "split": "test"},
        "fewshot": {"kind": "fewshot", "every": 500,
                    "datasets": {"digits": ("train", "test")},
                    "shots": (10,)},
    }
    config.checkpoint_every = 500
    config.log_every = 100
  elif arg in ("finetune", "scratch"):
    digits.few_labels(config,
                      "workdir/mae/pretrain" if arg == "finetune" else "")
  elif arg == "probe":
    config.objective = "linear_probe"
    config.init_from = "workdir/mae/pretrain"
    config.total_steps = PROBE_STEPS
    # MAE's probe: LARS at its learning rate (LARS steps each matrix by a
    # share of its norm, whatever the batch), momentum 0.9, no decay.
    config.optimizer.update(name="lars", learning_rate=6.4, momentum=0.9,
                            weight_decay=0.0, warmup_steps=30,
                            decay="cosine", grad_clip_norm=0.0,
                            frozen=linear_probe.PROBE_FROZEN)
    config.evaluators.test.every = PROBE_STEPS
    config.checkpoint_every = PROBE_STEPS
    config.log_every = 50
  else:
    raise ValueError(f"configs/mae/digits.py takes pretrain, finetune, "
                     f"scratch or probe, got {arg!r}")
  return config
