"""Every config key and its default, in one place.

A config file starts from `get_config()` and sets what its experiment
needs; `vit_jax.main` then takes any key as --config.KEY=VALUE. README's
"Config keys" table explains each.
"""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.dataset = ""
  config.data_dir = ""  # "": TFDS's default (or $TFDS_DATA_DIR).
  config.train_split = "train"
  # The shares the split is read in: unset, chosen when the run starts (the
  # most that the batch and the data allow, up to 2048) and recorded. The
  # batches are the same on every mesh whose data x fsdp divides it, so the
  # run can resume on a smaller or larger slice (vit_jax/data/shares.py).
  config.input_shares = ml_collections.config_dict.placeholder(int)
  # A folder dataset's contents as the run recorded them (a fingerprint of
  # its files): "" takes the folder as it is, and a resume refuses one whose
  # files changed; naming the new contents allows it
  # (vit_jax/training/resolve.py).
  config.folder_contents = ""
  config.image_size = 0
  # Comma-separated: flip, shift, inception_crop, random_crop (resize to 7/6
  # of image_size, crop back: the fine-tuning recipe).
  config.augment = ""
  # RandAugment "N,M": N ops a image at magnitude M of 10, after the crop
  # and the resize (docs/randaugment.md); "" for none. "2,10" is the plain
  # ImageNet baseline's (configs/imagenet/plain.py).
  config.randaugment = ""
  # Evaluation resizes to image_size; f < 1 resizes to image_size / f and
  # takes the central crop (0.875: 256 -> 224).
  config.eval_crop_fraction = 1.0
  # Images that do not decode: "skip" leaves them out, counts and names
  # them (a folder's when it is prepared, a TFDS record's when it is read);
  # "refuse" stops the run at the first (vit_jax/data/broken_records.py).
  config.broken_images = "skip"
  # `name` ("B/16") gives the sizes (Table 1); any other field overrides
  # models.create's. posemb: "learn" (1-D, as released), "learn2d",
  # "sincos2d" or "none" (Appendix D.4). mpp: pre-train by masked patch
  # prediction (configs/mpp.py). remat_policy and scan_layers trade
  # speed for memory and compile time, and leave the results as they are;
  # attention "fused" computes the same function through cuDNN's kernel on
  # NVIDIA GPUs (docs/models.md), "einsum" keeps the weights for figures.
  # What a checkpoint fixes beyond its sizes, left unset (None) here: the
  # function, layer_norm_epsilon, gelu ("tanh", "exact") and final_norm
  # ("tokens", "pooled"), and the architecture, classifier ("token",
  # "gap", "map"), layer_scale (its initial value), num_registers and
  # qk_norm (vit_jax/models/vit.py, ViTConfig). Unset, they are init_from's
  # (a SigLIP tower's "map", a DINOv2's registers and layer scale), else
  # the paper's ViT (1e-6, "tanh", "tokens"; "token", none, 0, False); the
  # run records them. One set against init_from's architecture is refused.
  # head_bias_init: the head's initial bias; -10 starts a sigmoid loss
  # with every class improbable (big_vision's ImageNet-21k configs).
  placeholder = ml_collections.config_dict.placeholder
  config.model = ml_collections.ConfigDict(dict(
      name="", classifier=placeholder(str),
      representation_size=placeholder(int),
      dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32",
      remat_policy="", scan_layers=False, attention="einsum",
      posemb="learn", mpp=False,
      layer_norm_epsilon=placeholder(float), gelu=placeholder(str),
      final_norm=placeholder(str), head_bias_init=0.0,
      layer_scale=placeholder(float), num_registers=placeholder(int),
      qk_norm=placeholder(bool)))
  # The targets and the loss (vit_jax/training/targets.py): "softmax" or
  # "sigmoid" cross-entropy; label smoothing; Mixup and CutMix, each
  # drawn for a whole batch with probability prob and its ratio from
  # Beta(alpha, alpha); their probs add up to at most 1.
  config.loss = "softmax"
  config.label_smoothing = 0.0
  config.mixup = ml_collections.ConfigDict(dict(prob=0.0, alpha=0.2))
  config.cutmix = ml_collections.ConfigDict(dict(prob=0.0, alpha=1.0))
  config.batch_size = 0
  config.accum_steps = 1  # Raise it where a batch does not fit in memory.
  config.total_steps = 0
  config.optimizer = ml_collections.ConfigDict(dict(
      name="", learning_rate=0.0, warmup_steps=0, decay="", weight_decay=0.0,
      grad_clip_norm=0.0, b1=0.9, b2=0.999, momentum=0.9,
      # Per-parameter rates (vit_jax/training/optimizer.py): layer-wise
      # decay (1.0: off), ((regex, multiplier), ...), and a regex of
      # parameters not trained at all.
      layer_decay=1.0, lr_mults=(), frozen=""))
  # A checkpoint to start from: an .npz, an HF transformers ViT directory,
  # a timm .safetensors or a workdir of ours (DIR[:STEP]).
  config.init_from = ""
  config.polyak_decay = 0.0  # 0: no Polyak average of the params.
  # Pure data parallelism over every device; a model that does not fit can
  # use --config.mesh.fsdp=N or model=N (data then takes the rest).
  config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, model=1))
  config.seed = 0
  config.log_every = 100
  # What the run measures, each every N steps and at the end (0: never):
  # name -> kind and settings, see vit_jax/training/evaluators/__init__.py. The
  # name prefixes the metrics: "test" logs test_accuracy.
  config.evaluators = ml_collections.ConfigDict(dict(
      test=dict(kind="accuracy", every=1000, split="test")))
  config.checkpoint_every = 1000
  config.keep_checkpoints = 3
  return config
