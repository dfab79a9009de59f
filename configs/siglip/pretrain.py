"""SigLIP's pre-training (Zhai et al., ICCV 2023) at the paper's batch of
32,768 image-text pairs: B/16 or So400m/14, both towers of one size.

  python -m vit_jax.main --config=configs/siglip/pretrain.py:B/16 \
      --workdir=DIR --config.dataset=captions:gs://BUCKET/PAIRS \
      --config.image_text.tokenizer=SPIECE_MODEL
  python -m vit_jax.plan --config=configs/siglip/pretrain.py:B/16 \
      --compare=v5p-256,v6e-256

The paper trains on WebLI, which is not public: any captioned dataset
(docs/image_text.md: a `captions:` folder of JSON-lines files, or a TFDS
dataset with a "captions" feature; coco_captions is the default, which
TFDS prepares from its own download) stands in, with the tokenizer of
SigLIP's English models, a SentencePiece model of 32,000 pieces (T5's c4
vocabulary). From the paper: 224 px images, the MAP head, texts of 64
tokens (the released checkpoints'), t' = log 10 and b = -10, the sigmoid
loss chunked over the devices, Adam with b2 = 0.95, learning rate 1e-3
and weight decay 1e-4, a cosine decay, 9 billion examples seen (its
ablations' length; the released models saw 40 billion). Departures: the
warm-up (the paper does not say; 2% here, 5,000 steps), gradients
clipped at 1.0 (big_vision's SigLIP configs), no augmentation but the
resize. So400m/14 is the shape-optimised ViT of Alabdulmohsin et al.
(2023): 1152 wide, 27 blocks, 16 heads, MLP 4304, its text tower the
same. docs/image_text.md has their plans.
"""

from configs.table2 import common

BATCH = 32_768
EXAMPLES_SEEN = 9_000_000_000
# The towers' sizes: the image tower's name and overrides, the text's.
SO400M = dict(hidden_size=1152, num_layers=27, num_heads=16, mlp_dim=4304)
TOWERS = {
    "B/16": ("B/16", {}, dict(hidden_size=768, num_layers=12, num_heads=12,
                              mlp_dim=3072)),
    "So400m/14": ("L/14", SO400M, SO400M),
}
# SigLIP's English tokenizer (big_vision's "c4_en").
C4_TOKENIZER = "gs://t5-data/vocabs/cc_en.32000/sentencepiece.model"


def get_config(arg="B/16"):
  if arg not in TOWERS:
    raise ValueError(f"configs/siglip/pretrain.py takes {sorted(TOWERS)}, "
                     f"got {arg!r}")
  name, image, text = TOWERS[arg]
  config = common.base_config()  # bfloat16, scanned blocks
  # What vit_jax.plan found on v5p-256 and v6e-256 (docs/image_text.md):
  # fsdp over 16 chips (a side of v6e-256's 16 x 16), and each block's
  # activations recomputed (B/16 keeping them needs 130 GiB on v5p).
  config.mesh.fsdp = 16
  config.model.remat_policy = "nothing_saveable"
  config.objective = "image_text"
  config.dataset = "coco_captions"
  config.image_size = 224
  config.augment = ""
  config.model.update(name=name, classifier="map", dropout_rate=0.0,
                      gelu="tanh", layer_norm_epsilon=1e-6, **image)
  config.image_text.update(
      loss="sigmoid", chunked=True, tokenizer=C4_TOKENIZER,
      text_vocab_size=32_000, text_length=64,
      **{f"text_{key}": value for key, value in text.items()})
  config.batch_size = BATCH
  config.total_steps = -(-EXAMPLES_SEEN // BATCH)
  config.optimizer.update(
      name="adam", b1=0.9, b2=0.95, learning_rate=1e-3, weight_decay=1e-4,
      decay="cosine", warmup_steps=5_000, grad_clip_norm=1.0)
  config.log_every = 100
  config.checkpoint_every = 5_000
  config.evaluators = {}
  return config
