"""Function matching on ImageNet-1k: a ViT-B/16 teacher into a ViT-S/16
student, after "Knowledge distillation: A good teacher is patient and
consistent" (Beyer et al., CVPR 2022; big_vision's
configs/proj/distill/bit_i1k.py).

  python -m vit_jax.main --config=configs/distill/imagenet.py:EPOCHS \
      --workdir=DIR --config.data_dir=DATA_DIR

EPOCHS is 300 or 1200 (the paper's "patient" schedules; big_vision's
config calls 1200 a good middle ground). The teacher is
hf://google/vit-base-patch16-224 (ViT-B/16 pre-trained on ImageNet-21k,
fine-tuned on ImageNet-1k at 224), read from Hugging Face's cache
(`hf download google/vit-base-patch16-224` first); any other source of
1,000 ImageNet classes takes its place with --config.distill.teacher.

From the paper's recipe: teacher and student see the same image, an
Inception crop at 224 with a flip, and every batch is mixed (Mixup, Beta
concentration 1); the loss is the KL divergence from the teacher at
temperature 1, with no label loss; batch 4096, Adam with its first moment
in bfloat16, gradients clipped at norm 1, cosine decay. The learning rate,
warm-up and weight decay are those of the plain ViT-S/16 recipe
(configs/imagenet/plain.py): the paper's (0.03, 5k steps, 3e-4) are a
ResNet student's. Data and evaluations as configs/imagenet/common.py; each
accuracy evaluator logs its teacher agreement too.
"""

from configs.imagenet import common, plain

EPOCHS = (300, 1200)
BATCH_SIZE = 4096
TEACHER = "hf://google/vit-base-patch16-224"


def get_config(arg=None):
  if arg not in map(str, EPOCHS):
    raise ValueError("configs/distill/imagenet.py takes EPOCHS, one of "
                     f"{', '.join(map(str, EPOCHS))}, got {arg!r}")
  config = common.base_config()
  config.model.update(name="S/16", classifier="gap", posemb="sincos2d",
                      representation_size=plain.REPRESENTATION_SIZES["S"])
  config.augment = "inception_crop,flip"
  config.mixup.update(prob=1.0, alpha=1.0)
  config.batch_size = BATCH_SIZE
  config.total_steps = common.total_steps(int(arg), BATCH_SIZE)
  config.optimizer.update(
      name="adam", learning_rate=plain.LEARNING_RATE,
      warmup_steps=plain.WARMUP_STEPS, decay="cosine",
      weight_decay=plain.WEIGHT_DECAY, grad_clip_norm=plain.GRAD_CLIP_NORM,
      mu_dtype="bfloat16")
  config.distill.update(teacher=TEACHER, temperature=1.0, label_weight=0.0)
  return config
