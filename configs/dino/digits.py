"""Self-distillation (DINOv2's recipe, scaled down) on the digits, then
learning from 10 labels a class.

  python -m vit_jax.main --config=configs/dino/digits.py:pretrain --workdir=workdir/dino/pretrain
  python -m vit_jax.main --config=configs/dino/digits.py:finetune --workdir=workdir/dino/finetune
  python -m vit_jax.main --config=configs/dino/digits.py:scratch --workdir=workdir/dino/scratch

"pretrain" learns from the 1,437 training digits, upsampled from 8x8 to
16x16 (patches of 4 pixels), without reading a label: 2 global crops of
16 px and 4 local ones of 12 px a digit (milder than DINOv2's, below), an
EMA teacher, DINO's, iBOT's and KoLeo's losses. Its teacher's k-NN and 10-shot accuracy on the test
digits are logged every 250 steps (the initial model's: the same run for
2 steps with `--config.optimizer.learning_rate=0
--config.optimizer.warmup_steps=1`). "finetune" starts from its teacher
and learns from `digits/10_per_class`; "scratch" learns the same from
random weights. docs/dino.md has the table.
"""

from configs import digits

PRETRAIN_STEPS = 1000


def get_config(arg="pretrain"):
  config = digits.get_config()
  # Upsampled to 16 px, with patches of 4: the 4x4 grid of the digits'
  # own model (8 px, patch 2), and local crops of 8 px at 2x2.
  config.image_size = 16
  config.model.patch_size = 4
  config.model.dropout_rate = 0.0
  if arg == "pretrain":
    config.objective = "dino"
    config.dino.update(
        head_prototypes=256, head_hidden_size=256, head_bottleneck=64,
        # DINOv2's schedules over this run's length: the temperature's
        # warm-up a third of it, the prototypes frozen for its first 5%.
        teacher_warmup_steps=300, freeze_prototypes_steps=50,
        momentum=0.992,
        # Crops of a digit that still show the digit: with DINOv2's (32-100%
        # and 5-32% of the area, flips, colours, blur) two crops of one
        # 8x8 digit are hardly more alike than two digits, and the DINO
        # loss collapses to uniformity (docs/dino.md). Global crops of
        # 80-100% at 16 px, 4 local ones of 40-80% at 12 px (a 3x3 grid);
        # no flips (a mirrored digit is another shape), nor colour jitter,
        # greyscale, blur or solarisation (a grey stroke has no colour to
        # be invariant to, and a blurred 8x8 digit none of its strokes).
        global_scale=(0.8, 1.0), local_crops=4, local_size=12,
        local_scale=(0.4, 0.8), flip_probability=0.0,
        jitter_probability=0.0, grey_probability=0.0,
        global_blur_probability=(0.0, 0.0), local_blur_probability=0.0,
        global_solarize_probability=(0.0, 0.0),
        # KoLeo spreads the class tokens evenly over the sphere: at
        # DINOv2's 0.1 the teacher's k-NN accuracy rises most, but its
        # 10-shot ridge falls below the initial model's; 0.03 lifts both.
        koleo_weight=0.03)
    config.total_steps = PRETRAIN_STEPS
    # DINOv2's AdamW: weight decay 0.04 -> 0.4 by a cosine, clipping at
    # 3.0, the patch embedding at 0.2 of the rate, layer decay 0.9.
    config.optimizer.update(
        name="adam", learning_rate=1e-3, warmup_steps=100, decay="cosine",
        weight_decay=0.04, weight_decay_end=0.4, grad_clip_norm=3.0,
        layer_decay=0.9, lr_mults=(("embedding/.*", 0.2),))
    knn = {"kind": "knn", "every": 250,
           "datasets": {"digits": ("train", "test")}}
    config.evaluators = {
        "knn": knn,
        "fewshot": {"kind": "fewshot", "every": 250,
                    "datasets": {"digits": ("train", "test")},
                    "shots": (10,)},
    }
    config.checkpoint_every = 250
    config.log_every = 50
  elif arg in ("finetune", "scratch"):
    digits.few_labels(config,
                      "workdir/dino/pretrain" if arg == "finetune" else "")
  else:
    raise ValueError(f"configs/dino/digits.py takes pretrain, finetune or "
                     f"scratch, got {arg!r}")
  return config
