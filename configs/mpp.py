"""Masked patch prediction pre-training (Section 4.6, Appendix B.1.2).

  python -m vit_jax.main --config=configs/mpp.py --workdir=...         (jft)
  python -m vit_jax.main --config=configs/mpp.py:digits --workdir=...

"jft": the paper's run, ViT-B/16 for 1M steps at batch 4096 on JFT-300M
(about 14 epochs; prepared as for configs/table2, in config.data_dir), Adam with a base learning rate of 2e-4, 10k warm-up
steps and cosine decay. "digits": the same objective on the digits model,
for a try on a CPU. Either encoder then fine-tunes like any other run:
`--config.init_from=<this run's workdir>` on a classification config; the
mask embedding and the per-patch head are dropped (`checkpoint.adapt`).
There are no labels to evaluate on, so the evaluators are off; the log's
train_loss is the cross-entropy over the corrupted patches.
"""

from configs import digits
from configs.table2 import common


def get_config(arg="jft"):
  if arg == "jft":
    # The TPU settings of the Table 2 runs (bfloat16 compute, scanned
    # blocks, FSDP over 8 cores) and their JFT-300M source and augmentation.
    config = common.base_config()
    config.dataset = common.SOURCES["jft"]
    config.image_size = 224
    config.augment = "inception_crop,flip"
    config.model.name = "B/16"
    config.batch_size = 4096
    config.total_steps = 1_000_000
    config.optimizer.update(name="adam", learning_rate=2e-4,
                            warmup_steps=10_000, decay="cosine")
    config.log_every = 1000
    config.checkpoint_every = 5000
  elif arg == "digits":
    config = digits.get_config()
    config.total_steps = 300
    config.optimizer.warmup_steps = 30
    config.checkpoint_every = 300
  else:
    raise ValueError(f"configs/mpp.py: unknown argument {arg!r}; 'jft' or "
                     "'digits'")
  config.model.mpp = True
  for evaluator in config.evaluators.values():
    evaluator.every = 0
  return config
