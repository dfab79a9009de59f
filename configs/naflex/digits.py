"""The digits model on digits at sizes of their own (digits/mixed_sizes:
the longer side 8-16 pixels, aspect ratios 1:3 to 3:1, so 8 to 64 patches
of 2 x 2), within a budget of 64 patches.

  python -m vit_jax.main --config=configs/naflex/digits.py:packed \
      --workdir=workdir/packed

`naflex` (the default) reads each image as one sequence, enlarged or
shrunk to fill the 64 patches (SigLIP 2's NaFlex); `square` resizes each
to 16 x 16 pixels, the same 64 patches; `packed` reads each at
its own size and packs them into sequences of 64 (NaViT's Patch n' Pack),
at the defaults: naflex.images_per_sequence 2 read for each sequence,
batch_size then counting sequences; `packed_drop` also leaves out a
quarter of each image's patches at random, and reads 3.2 images a
sequence. docs/naflex.md compares them (benchmarks/naflex.py).
"""

from configs import digits

VARIANTS = ("naflex", "square", "packed", "packed_drop")


def get_config(arg="naflex"):
  if arg not in VARIANTS:
    raise ValueError(f"configs/naflex/digits.py takes one of {VARIANTS}, "
                     f"got {arg!r}")
  config = digits.get_config()
  config.dataset = "digits/mixed_sizes"
  config.image_size = 16  # The position table: 8 x 8 patches of 2.
  config.naflex.max_num_patches = 0 if arg == "square" else 64
  if arg.startswith("packed"):
    config.naflex.packing = True  # images_per_sequence: the default.
  if arg == "packed_drop":  # Smaller images: more of them a sequence.
    config.naflex.token_drop = 0.25
    config.naflex.images_per_sequence = 3.2
  config.total_steps = 150
  config.optimizer.warmup_steps = 15
  config.log_every = 10
  config.evaluators.test.every = 150
  config.checkpoint_every = 50
  return config
