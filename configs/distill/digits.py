"""A student of half the digits model's width taught by `make train`'s run.

  python -m vit_jax.main --config=configs/distill/digits.py \
      --workdir=workdir/distill

Function matching (Beyer et al. 2022): the loss is the KL divergence from
the teacher's probabilities on the very images the student sees, with no
label loss (config.distill.label_weight 0). The teacher is the run in
workdir/digits (`make train`); --config.distill.teacher names any other
source. The same student from labels alone: --config.distill.teacher=''.

`configs/distill/digits.py:deit` is DeiT's recipe instead (Touvron et al.
2021): the student has a distillation token, whose head learns the
teacher's top class (kind "hard") while the class token's learns the
labels, half the loss each; it predicts with the mean of the two heads.
"""

from configs import digits

VARIANTS = ("", "deit")


def get_config(arg=""):
  if arg not in VARIANTS:
    raise ValueError(f"configs/distill/digits.py takes no argument or "
                     f"'deit', got {arg!r}")
  config = digits.get_config()
  config.model.hidden_size = 32
  config.model.mlp_dim = 128
  config.total_steps = 400
  config.optimizer.warmup_steps = 40
  config.evaluators.test.every = 100
  config.checkpoint_every = 100
  config.distill.teacher = "workdir/digits"
  if arg == "deit":
    config.model.distill_token = True
    config.distill.update(kind="hard", label_weight=0.5)
  return config
