"""The Vision Transformer (Dosovitskiy et al., ICLR 2021) as Flax linen modules.

Module names follow the released checkpoints (`Transformer/encoderblock_{i}/
MultiHeadDotProductAttention_1`, ...), so our params tree *is* the release
layout and `checkpoint.save_npz` is a flatten. Every parameter, and each
block's input, carries logical axis names; `vit_jax.sharding`'s rules table
maps them to mesh axes, so the model names none.
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax import errors, mpp as mpp_lib, sharding
from vit_jax.models import resnet

Dtype = Any

# How a model's function differs between sources of weights. The release
# uses LayerNorm epsilon 1e-6 (not flax's 1e-5) and the tanh GELU; HF
# transformers' ViT configs say 1e-12 and the exact GELU, timm 1e-6 and the
# exact GELU; timm's average-pool models normalise the pooled features
# ("fc_norm") instead of every token.
GELU_KINDS = ("tanh", "exact")
FINAL_NORMS = ("tokens", "pooled")

# Rematerialisation: what the backward pass keeps of each block's forward
# (jax.checkpoint_policies); the rest is recomputed. "" keeps everything.
REMAT_POLICIES = {
    "": None,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable":
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _init(initializer, axes):
  return nn.with_logical_partitioning(initializer, axes)


def _layer_norm(name, epsilon, dtype, param_dtype):
  return nn.LayerNorm(
      epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
      scale_init=_init(nn.initializers.ones, ("embed",)),
      bias_init=_init(nn.initializers.zeros, ("embed",)),
      name=name)


class Attention(nn.Module):
  """Multi-head self-attention; q/k/v kernels are (D, heads, D/heads)."""
  num_heads: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, *, train):
    width = x.shape[-1]
    head_dim = width // self.num_heads

    def project(name):
      return nn.DenseGeneral(
          (self.num_heads, head_dim), dtype=self.dtype,
          param_dtype=self.param_dtype,
          kernel_init=_init(nn.initializers.xavier_uniform(),
                            ("embed", "heads", "kv")),
          bias_init=_init(nn.initializers.zeros, ("heads", "kv")),
          name=name)(x)

    # Heads before tokens, [..., heads, tokens, head_dim], for both
    # batched matmuls: left to itself, XLA:CPU lays weights.v out with the
    # tokens last and runs it far below its matmul rate
    # (docs/speed_on_cpu.md). On TPU the layout is XLA's to choose either way.
    q, k, v = (jnp.swapaxes(project(name), -2, -3)
               for name in ("query", "key", "value"))
    # Softmax in float32 whatever the compute dtype: bf16 logits lose the
    # small differences that attention depends on.
    logits = jnp.einsum("...hqd,...hkd->...hqk", q, k).astype(jnp.float32)
    weights = nn.softmax(logits / jnp.sqrt(head_dim).astype(jnp.float32))
    # Kept for the Section 4.5 figures (mean attention distance, rollout).
    self.sow("intermediates", "attention_weights", weights)
    weights = nn.Dropout(self.dropout_rate)(weights, deterministic=not train)
    out = jnp.einsum("...hqk,...hkd->...hqd", weights.astype(self.dtype), v)
    out = jnp.swapaxes(out, -2, -3)
    return nn.DenseGeneral(
        width, axis=(-2, -1), dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=_init(nn.initializers.xavier_uniform(),
                          ("heads", "kv", "embed")),
        bias_init=_init(nn.initializers.zeros, ("embed",)),
        name="out")(out)


class MlpBlock(nn.Module):
  """Dense -> GELU (`gelu`: "tanh", the release's approximation, or
  "exact") -> Dense."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  gelu: str = "tanh"

  @nn.compact
  def __call__(self, x, *, train):
    width = x.shape[-1]
    dense = lambda features, axes, name: nn.Dense(
        features, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=_init(nn.initializers.xavier_uniform(), axes),
        bias_init=_init(nn.initializers.normal(stddev=1e-6), axes[-1:]),
        name=name)
    x = dense(self.mlp_dim, ("embed", "mlp"), "Dense_0")(x)
    x = nn.gelu(x, approximate=self.gelu == "tanh")
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    x = dense(width, ("mlp", "embed"), "Dense_1")(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=not train)


class EncoderBlock(nn.Module):
  """Pre-LN block: z' = MSA(LN(z)) + z; z = MLP(LN(z')) + z'.

  Returns (z, None), the form nn.scan takes; `train` is positional so that
  nn.remat can hold it static.
  """
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  layer_norm_epsilon: float = 1e-6
  gelu: str = "tanh"

  @nn.compact
  def __call__(self, x, train):
    # Each block's input split over the batch like the batch itself: left
    # to itself, XLA may replicate the batch inside a layer scan rather than
    # gather a weight, and need tens of GiB per device.
    x = sharding.constrain(x, ("batch", "tokens", "embed"))
    # One counter across module types, as in the release files.
    y = _layer_norm("LayerNorm_0", self.layer_norm_epsilon, self.dtype,
                    self.param_dtype)(x)
    y = Attention(self.num_heads, self.attention_dropout_rate, self.dtype,
                  self.param_dtype, name="MultiHeadDotProductAttention_1")(
                      y, train=train)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
    x = x + y
    y = _layer_norm("LayerNorm_2", self.layer_norm_epsilon, self.dtype,
                    self.param_dtype)(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, self.param_dtype,
                 self.gelu, name="MlpBlock_3")(y, train=train)
    return x + y, None


POSEMB_KINDS = ("learn", "learn2d", "sincos2d", "none")


def sincos2d_table(rows, cols, width, temperature=10_000.0):
  """[rows * cols, width] fixed embeddings, row-major over the patch grid:
  sines and cosines of the row index, then of the column index, at width/4
  geometrically spaced frequencies each."""
  if width % 4:
    raise errors.InputError(
        f"posemb 'sincos2d' needs a hidden_size divisible by 4, "
        f"got {width}")
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))
  row, col = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
  angles = [index.reshape(-1, 1) * omega for index in (row, col)]
  return np.concatenate([f(a) for a in angles for f in (np.sin, np.cos)],
                        axis=1).astype(np.float32)


class AddPositionEmbedding(nn.Module):
  """Adds position embeddings to [N, extra + rows * cols, D] tokens, the
  `extra` (class) token first and the patches row-major.

  kind (Appendix D.4):
    "learn": one learned [1, tokens, D] table, as in the released models.
    "learn2d": a learned row table [rows, D/2] and column table
      [cols, D - D/2]; a patch's embedding is its row's and its column's,
      concatenated. The class token has its own learned vector.
    "sincos2d": fixed, `sincos2d_table`; zero for the class token.
    "none": nothing is added.
  grid: (rows, cols) of the patch grid; only the 2-D kinds read it.
  """
  kind: str = "learn"
  grid: Optional[tuple] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    _, tokens, width = x.shape
    init = nn.initializers.normal(stddev=0.02)
    if self.kind == "none":
      return x
    if self.kind == "learn":
      posemb = self.param("pos_embedding", _init(init, (None, None, "embed")),
                          (1, tokens, width), self.param_dtype)
      return x + posemb.astype(x.dtype)
    rows, cols = self.grid
    extra = tokens - rows * cols
    if self.kind == "learn2d":
      # Tiny tables, replicated on every device.
      row = self.param("row_embedding", _init(init, (None, None)),
                       (rows, width // 2), self.param_dtype)
      col = self.param("col_embedding", _init(init, (None, None)),
                       (cols, width - width // 2), self.param_dtype)
      table = jnp.concatenate([
          jnp.broadcast_to(row[:, None], (rows, cols, row.shape[-1])),
          jnp.broadcast_to(col[None], (rows, cols, col.shape[-1]))],
                              axis=-1).reshape(rows * cols, width)
      token = (self.param("token_embedding", _init(init, (None, None)),
                          (extra, width), self.param_dtype) if extra
               else jnp.zeros((0, width), table.dtype))
    else:  # "sincos2d"
      table = jnp.asarray(sincos2d_table(rows, cols, width))
      token = jnp.zeros((extra, width), table.dtype)
    posemb = jnp.concatenate([token.astype(table.dtype), table])
    return x + posemb[None].astype(x.dtype)


class Encoder(nn.Module):
  """Position embedding, then `num_layers` blocks and a final LayerNorm
  (unless `final_norm` is "pooled": then the head normalises what it reads).

  posemb: a kind of AddPositionEmbedding, one of POSEMB_KINDS.
  remat_policy: a key of REMAT_POLICIES; each block's backward recomputes
    what the policy does not keep, trading FLOPs for memory.
  scan_layers: one `encoderblock` applied by nn.scan, its params stacked on
    a leading "layers" axis: the step compiles one block, not num_layers.
    `checkpoint` converts to and from the release's `encoderblock_{i}`.
  """
  num_layers: int
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  remat_policy: str = ""
  scan_layers: bool = False
  posemb: str = "learn"
  layer_norm_epsilon: float = 1e-6
  gelu: str = "tanh"
  final_norm: str = "tokens"

  @nn.compact
  def __call__(self, x, *, train, grid=None):
    """x: [N, tokens, D]; grid: the (rows, cols) of its patches."""
    x = AddPositionEmbedding(self.posemb, grid, self.param_dtype,
                             name="posembed_input")(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    block = EncoderBlock
    if self.remat_policy:
      # Argument 2 (after the module and x) is `train`, a Python bool.
      # Inside a scan, XLA cannot merge the recomputation away, so the CSE
      # barriers that nn.remat adds by default would only cost.
      block = nn.remat(block, policy=REMAT_POLICIES[self.remat_policy],
                       prevent_cse=not self.scan_layers, static_argnums=(2,))
    sizes = dict(num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                 dropout_rate=self.dropout_rate,
                 attention_dropout_rate=self.attention_dropout_rate,
                 dtype=self.dtype, param_dtype=self.param_dtype,
                 layer_norm_epsilon=self.layer_norm_epsilon, gelu=self.gelu)
    if self.scan_layers:
      block = nn.scan(
          block, variable_axes={"params": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=nn.broadcast, length=self.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = block(**sizes, name="encoderblock")(x, train)
    else:
      for i in range(self.num_layers):
        x, _ = block(**sizes, name=f"encoderblock_{i}")(x, train)
    if self.final_norm == "pooled":
      return x
    return _layer_norm("encoder_norm", self.layer_norm_epsilon, self.dtype,
                       self.param_dtype)(x)


class ImageEncoder(nn.Module):
  """Images to encoded tokens [N, tokens, D], what every head reads.

  uint8 images are scaled to [-1, 1] here, on the device; an optional BiT
  ResNet stem; the patch embedding; for masked patch prediction, a learned
  [mask] embedding that a `corruption` puts in; the class token first when
  `class_token`; then the Encoder. The other fields are VisionTransformer's,
  whose `image_encoder` makes this module: their defaults are there.
  """
  patch_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  class_token: bool
  mask_token: bool
  dropout_rate: float
  attention_dropout_rate: float
  dtype: Dtype
  param_dtype: Dtype
  remat_policy: str
  scan_layers: bool
  posemb: str
  resnet_stages: Optional[tuple]
  resnet_width: int
  layer_norm_epsilon: float
  gelu: str
  final_norm: str

  @nn.compact
  def __call__(self, images, *, train, corruption=None):
    if images.dtype == jnp.uint8:  # As the input pipeline ships them.
      images = images.astype(jnp.float32) / 127.5 - 1
    x = images.astype(self.dtype)
    if self.resnet_stages is not None:
      x = resnet.stem(x, self.resnet_stages, self.resnet_width, self.dtype,
                      self.param_dtype)
    p = self.patch_size
    x = nn.Conv(
        self.hidden_size, (p, p), strides=(p, p), padding="VALID",
        dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=_init(nn.initializers.lecun_normal(),
                          (None, None, None, "embed")),
        bias_init=_init(nn.initializers.zeros, ("embed",)),
        name="embedding")(x)
    n, h, w, d = x.shape
    x = x.reshape(n, h * w, d)
    if self.mask_token:
      mask = self.param(
          "mask_embedding", _init(nn.initializers.normal(stddev=0.02),
                                  (None, None, "embed")),
          (1, 1, d), self.param_dtype)
      if corruption is not None:
        x = mpp_lib.apply(corruption, x, mask)
    if self.class_token:
      cls = self.param("cls", _init(nn.initializers.zeros, (None, None, "embed")),
                       (1, 1, d), self.param_dtype)
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    return Encoder(
        self.num_layers, self.num_heads, self.mlp_dim, self.dropout_rate,
        self.attention_dropout_rate, self.dtype, self.param_dtype,
        self.remat_policy, self.scan_layers, self.posemb,
        self.layer_norm_epsilon, self.gelu, self.final_norm,
        name="Transformer")(x, train=train, grid=(h, w))


class ClassifierHead(nn.Module):
  """Encoded tokens -> float32 logits [N, num_classes]: the class token
  ("token") or the mean of the tokens ("gap"), normalised when `final_norm`
  is "pooled" (timm's fc_norm), an optional tanh pre-logits layer of
  `representation_size`, and a zero-initialised linear head."""
  num_classes: int
  classifier: str = "token"
  representation_size: Optional[int] = None
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  final_norm: str = "tokens"
  layer_norm_epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x):
    x = x[:, 0] if self.classifier == "token" else x.mean(axis=1)
    if self.final_norm == "pooled":
      x = _layer_norm("fc_norm", self.layer_norm_epsilon, self.dtype,
                      self.param_dtype)(x)
    if self.representation_size is not None:
      x = nn.Dense(
          self.representation_size, dtype=self.dtype,
          param_dtype=self.param_dtype,
          kernel_init=_init(nn.initializers.lecun_normal(), ("embed", "mlp")),
          bias_init=_init(nn.initializers.zeros, ("mlp",)),
          name="pre_logits")(x)
      x = nn.tanh(x)
    # What the head reads (the pre-logits): few-shot evaluation fits its own
    # linear classifiers to these.
    self.sow("intermediates", "features", x)
    # Zero-initialised: a fresh head starts from uniform predictions.
    logits = nn.Dense(
        self.num_classes, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=_init(nn.initializers.zeros, (None, "classes")),
        bias_init=_init(nn.initializers.zeros, ("classes",)),
        name="head")(x)
    return logits.astype(jnp.float32)


class PatchColourHead(nn.Module):
  """Encoded tokens -> float32 logits [N, patches, 512]: each patch token's
  prediction of its patch's mean colour (vit_jax/mpp.py)."""
  class_token: bool = True
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    patches = x[:, 1:] if self.class_token else x
    return nn.Dense(
        mpp_lib.NUM_CLASSES, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=_init(nn.initializers.zeros, (None, "classes")),
        bias_init=_init(nn.initializers.zeros, ("classes",)),
        name="mpp_head")(patches).astype(jnp.float32)


class VisionTransformer(nn.Module):
  """ViT classifier: an ImageEncoder read by a ClassifierHead. Images are
  NHWC in [-1, 1], or uint8 in [0, 255]; returns float32 logits.

  classifier: "token" prepends a learned class token and reads it out; "gap"
    averages the patch tokens (no class token, Appendix D.3).
  representation_size: width of the tanh pre-logits layer used in
    pre-training, or None for a plain linear head (fine-tuning).
  posemb: the position embedding, one of POSEMB_KINDS (Appendix D.4): the
    released models' "learn" (1-D), "learn2d", "sincos2d" or "none".
  resnet_stages: None for a plain ViT; for a hybrid, the units of each
    stage of the BiT ResNet stem (`models/resnet.py`) whose feature map the
    patch embedding reads, e.g. (3, 4, 9) for R50+ViT-B/16.
  resnet_width: the stem's root width in channels (64 x BiT's width factor).
  remat_policy, scan_layers: see Encoder; neither changes the results.
  layer_norm_epsilon, gelu ("tanh" or "exact"), final_norm ("tokens" or
    "pooled"): what differs between the release's function (the defaults)
    and the weights of HF transformers and timm (vit_jax/torch_layouts.py).
    final_norm "pooled" keeps the last LayerNorm's params as `fc_norm`.

  The encoder and the head share this module's scope (`nn.share_scope`),
  so the params are the release layout: embedding, cls, Transformer,
  pre_logits, head.
  """
  num_classes: int
  patch_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  classifier: str = "token"
  representation_size: Optional[int] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  remat_policy: str = ""
  scan_layers: bool = False
  posemb: str = "learn"
  resnet_stages: Optional[tuple] = None
  resnet_width: int = 64
  layer_norm_epsilon: float = 1e-6
  gelu: str = "tanh"
  final_norm: str = "tokens"

  @property
  def token_stride(self):
    """Image pixels per token along a side: the patch size, times what a
    hybrid's stem shrinks the image by (4 x 2^(stages - 1))."""
    if self.resnet_stages is None:
      return self.patch_size
    return self.patch_size * resnet.reduction(self.resnet_stages)

  def describe_patch(self):
    """'patch size 16', and for a hybrid what the stem multiplies it by."""
    if self.resnet_stages is None:
      return f"patch size {self.patch_size}"
    stem = self.token_stride // self.patch_size
    return f"patch size {self.patch_size} x {stem} (the ResNet stem's)"

  def setup(self):
    self.check_options()
    self.encoder = self.image_encoder(mask_token=False)
    nn.share_scope(self, self.encoder)
    self.classify = ClassifierHead(
        self.num_classes, self.classifier, self.representation_size,
        self.dtype, self.param_dtype, self.final_norm, self.layer_norm_epsilon)
    nn.share_scope(self, self.classify)

  def __call__(self, images, *, train):
    self.check_image_size(images)
    return self.classify(self.encoder(images, train=train))

  @nn.nowrap
  def loss(self, params, images, labels, weights, key):
    """The training loss: the examples' cross-entropies summed with
    `weights` (1/n each for the mean over n; 0 leaves a row out); `key` draws
    the dropout."""
    logits = self.apply({"params": params}, images, train=True,
                        rngs={"dropout": key})
    return (weights * optax.softmax_cross_entropy_with_integer_labels(
        logits, labels)).sum()

  @nn.nowrap
  def check_options(self):
    """InputError for options no model has; models.create calls it too."""
    if self.classifier not in ("token", "gap"):
      raise errors.InputError(f"classifier must be 'token' or 'gap', got "
                              f"{self.classifier!r}")
    if self.posemb not in POSEMB_KINDS:
      raise errors.InputError(f"posemb must be one of {POSEMB_KINDS}, got "
                              f"{self.posemb!r}")
    if self.hidden_size % self.num_heads:
      raise errors.InputError(
          f"hidden_size {self.hidden_size} is not divisible by num_heads "
          f"{self.num_heads}")
    if self.gelu not in GELU_KINDS:
      raise errors.InputError(f"gelu must be one of {GELU_KINDS}, got "
                              f"{self.gelu!r}")
    if self.final_norm not in FINAL_NORMS:
      raise errors.InputError(f"final_norm must be one of {FINAL_NORMS}, got "
                              f"{self.final_norm!r}")
    if self.remat_policy not in REMAT_POLICIES:
      raise errors.InputError(
          f"unknown remat_policy {self.remat_policy!r}; one of "
          f"{sorted(REMAT_POLICIES)} ('' rematerialises nothing)")

  @nn.nowrap
  def check_image_size(self, images):
    height, width = images.shape[1:3]
    if height % self.token_stride or width % self.token_stride:
      raise errors.InputError(
          f"{self.describe_patch()} does not divide the image "
          f"size {height}x{width}")

  @nn.nowrap
  def image_encoder(self, mask_token):
    return ImageEncoder(
        self.patch_size, self.hidden_size, self.num_layers, self.num_heads,
        self.mlp_dim, self.classifier == "token", mask_token,
        self.dropout_rate, self.attention_dropout_rate, self.dtype,
        self.param_dtype, self.remat_policy, self.scan_layers, self.posemb,
        self.resnet_stages, self.resnet_width, self.layer_norm_epsilon,
        self.gelu, self.final_norm)


class MaskedPatchViT(VisionTransformer):
  """The same encoder, with a [mask] embedding, read by a PatchColourHead:
  masked patch prediction (`vit_jax/mpp.py`). Returns logits [N, patches,
  512]; `corruption` (an mpp.Corruption) is applied to the patch
  embeddings. num_classes and representation_size are unused. Its encoder
  fine-tunes like any other through `init_from`, which drops mask_embedding
  and mpp_head."""

  @nn.nowrap
  def check_options(self):
    super().check_options()
    if self.final_norm == "pooled":
      raise errors.InputError(
          "masked patch prediction reads every token: final_norm must be "
          "'tokens'")

  def setup(self):
    self.check_options()
    self.encoder = self.image_encoder(mask_token=True)
    nn.share_scope(self, self.encoder)
    self.predict = PatchColourHead(self.classifier == "token", self.dtype,
                                   self.param_dtype)
    nn.share_scope(self, self.predict)

  def __call__(self, images, *, train, corruption=None):
    self.check_image_size(images)
    return self.predict(self.encoder(images, train=train,
                                     corruption=corruption))

  @nn.nowrap
  def loss(self, params, images, labels, weights, key):
    """Each image's mean cross-entropy over its corrupted patches, summed
    with `weights` as VisionTransformer.loss; labels are not used. `key`
    draws the corruption and the dropout."""
    del labels
    return mpp_lib.loss(self, params, images, weights, *jax.random.split(key))
