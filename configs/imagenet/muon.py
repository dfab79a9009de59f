"""The plain ViT baseline (configs/imagenet/plain.py) trained with Muon:
orthogonalised momentum on the blocks' matrices, AdamW on the rest
(vit_jax/training/muon.py).

  python -m vit_jax.main --config=configs/imagenet/muon.py:MODEL,EPOCHS \
      --workdir=DIR --config.data_dir=DATA_DIR
  python -m vit_jax.plan --config=configs/imagenet/muon.py:S/16,90 \
      --compare=v3-8,v5p-8

MODEL is S/16 or B/16, EPOCHS 90, 150 or 300; everything but the
optimizer is plain.py's (batch 1024, 10k warm-up, cosine, RandAugment,
Mixup, GAP, sin-cos position embeddings).

timm publishes its Muon's defaults (timm/optim/muon.py), not an ImageNet
ViT result with them; these are they: momentum 0.95, each update scaled to
AdamW's RMS (0.2 * sqrt(max(fan_in, fan_out)), Kimi's "match_rms_adamw")
so that one peak rate serves both parts, the AdamW part's betas (0.9,
0.95). The rate and weight decay are plain.py's (1e-3; 1e-4 of the
kernels a step at the peak). Departures, optax's choices: Nesterov
momentum (timm's default has none) and Jordan's Newton-Schulz
coefficients, 5 steps of (3.4445, -4.775, 2.0315) (timm's default is a
different quintic per step).
"""

from configs.imagenet import plain

MUON_BETA = 0.95
ADAMW_B2 = 0.95  # timm's Muon: betas (0.9, 0.95) for its AdamW fallback.
CONSISTENT_RMS = 0.2


def get_config(arg=None):
  try:
    config = plain.get_config(arg)
  except ValueError:
    raise ValueError(f"configs/imagenet/muon.py takes {plain.USAGE}, got "
                     f"{arg!r}") from None
  config.optimizer.update(name="muon", muon_beta=MUON_BETA, b2=ADAMW_B2,
                          muon_consistent_rms=CONSISTENT_RMS)
  return config
