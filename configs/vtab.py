"""VTAB-1k fine-tuning (Table 2's last row; Table 4, Appendix B.1).

  python -m vit_jax.vtab --config=configs/vtab.py:MODEL --workdir=DIR \
      --config.init_from=CHECKPOINT --config.data_dir=DATA_DIR

runs all 19 tasks and tabulates them (vit_jax/training/finetune_suite.py).
One task alone:

  python -m vit_jax.main --config=configs/vtab.py:MODEL,TASK[,val] ...

MODEL names the checkpoint's model (L/16, H/14, ...); TASK is a name of
vit_jax/data/vtab_tasks.py (e.g. clevr_count); `val` trains on train800 and
scores val200 rather than train800val200 and test. The task datasets must
be prepared in DATA_DIR under their TFDS names.
"""

from configs.table2 import common, finetune
from vit_jax.data import vtab_tasks as registry
from vit_jax.training import finetune_suite

# Table 4: 2,500 steps at learning rate 0.01 for every task; otherwise the
# fine-tuning of Table 2 (SGD momentum 0.9, batch 512, cosine decay, clip at
# global norm 1, no weight decay, 384 px).
STEPS = 2_500
LEARNING_RATE = 0.01
# Not in the paper: a ramp of 200 steps, between the released code's 100
# for 500-step runs and 500 for 10k-step ones.
WARMUP_STEPS = 200

USAGE = "MODEL[,TASK][,val], e.g. L/16 or L/16,clevr_count"


def get_config(arg=None):
  parts = common.fields(arg, "configs/vtab.py", USAGE, 1, 3)
  model = parts[0]
  config = common.base_config()
  config.model.update(name=model, representation_size=None, dropout_rate=0.0,
                      attention_dropout_rate=0.0)
  # 384 px, or the patch grid that covers it (H/14: 378).
  config.image_size = finetune.IMAGE_SIZES.get(model, 384)
  config.model.remat_policy = finetune.REMAT_POLICY  # Same images, batch.
  # No flips or crops: they change the answer of structured tasks (the
  # position and orientation of dSprites, the distances of KITTI and Clevr).
  config.augment = ""
  config.eval_crop_fraction = 1.0
  config.batch_size = finetune.BATCH_SIZE
  config.total_steps = STEPS
  config.optimizer.update(
      name="sgd", learning_rate=LEARNING_RATE, warmup_steps=WARMUP_STEPS,
      decay="cosine", weight_decay=0.0, grad_clip_norm=finetune.GRAD_CLIP_NORM,
      momentum=finetune.MOMENTUM)
  config.log_every = 50
  config.checkpoint_every = 500
  # The task's data and evaluator come from finetune_suite.task_config, for
  # one task here or for each in turn in `python -m vit_jax.vtab`.
  config.dataset = ""
  config.evaluators = {}
  if len(parts) > 1:
    options = parts[1:]
    val = "val" in options
    tasks = [p for p in options if p != "val"]
    if len(tasks) != 1:
      raise ValueError(f"configs/vtab.py takes {USAGE}, got {arg!r}")
    config = finetune_suite.task_config(config, registry.get(tasks[0]), val)
  return config
