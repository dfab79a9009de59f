"""The Vision Transformer (Dosovitskiy et al., ICLR 2021) as Flax linen modules.

Module names follow the released checkpoints (`Transformer/encoderblock_{i}/
MultiHeadDotProductAttention_1`, ...), so our params tree *is* the release
layout and `weights.npz.save_npz` is a flatten. Every parameter, and each
block's input, carries logical axis names; `vit_jax.sharding`'s rules table
maps them to mesh axes, so the model names none.
"""

import dataclasses
import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors, sharding
from vit_jax.models import (
  fp8 as fp8_lib,
  masked_patches as mpp_lib,
  naflex,
  options,
  resnet,
  rope as rope_lib,
  splash,
)

Dtype = Any

# How a model's function differs between sources of weights. The release
# uses LayerNorm epsilon 1e-6 (not flax's 1e-5) and the tanh GELU; HF
# transformers' ViT configs say 1e-12 and the exact GELU, timm 1e-6 and the
# exact GELU; timm's average-pool models normalise the pooled features
# ("fc_norm") instead of every token.
GELU_KINDS = ("tanh", "exact")
MLP_KINDS = ("gelu", "swiglu")
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


POSEMB_KINDS = ("learn", "learn2d", "sincos2d", "none")
ATTENTION_KINDS = ("einsum", "fused", "splash")
CLASSIFIERS = ("token", "gap", "map")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTConfig:
  """Every setting of a ViT but its number of classes: what `models.create`
  takes as overrides, and config.model's keys (runs/settings.py derives
  them from these fields). Each module reads what it needs of it.

  Notes beyond each field's description:
  classifier "map" is big_vision's MAPHead (SigLIP's). remat_policy and
  scan_layers never change the results; a scanned model's stacked blocks
  are converted to and from the release's `encoderblock_{i}` by
  `weights.npz`. attention: the function is the same whichever computes
  it (softmax in float32); "einsum" is the reference whose weights the
  Section 4.5 figures read, "fused" is `jax.nn.dot_product_attention`
  (cuDNN's kernel on NVIDIA GPUs in half precision, else XLA's), "splash"
  Pallas's kernel (models/splash.py; interpreted on CPUs, refused on
  GPUs); neither keeps weights or takes attention dropout.
  layer_norm_epsilon, gelu and final_norm are what differs between the
  release's function (the defaults) and the weights of HF transformers and
  timm (vit_jax/weights/torch_layouts.py); final_norm "pooled" keeps the
  last LayerNorm's params as `fc_norm`. A distillation token (DeiT's,
  `dist`) follows the class token and has its own row of the position
  embedding and its own head (`head_dist`); the model's logits are the
  mean of the two heads', as timm's are at inference, and training with a
  teacher (training/distill.py) asks for the pair (`both_heads`).
  Registers follow the class and distillation tokens once the position
  embedding is added (they get none) and are left out of "gap"'s mean and
  "map"'s pooling. fp8 rounds the operands of the
  encoder blocks' dense layers (models/fp8.py); the patch embedding, the
  pooling head and the classifier keep the compute dtype.
  """
  patch_size: int = options.key(
      description="pixels per patch side; unset: the name's", config=None,
      before=None, at_least=1)
  hidden_size: int = options.key(
      description="the token width; unset: the name's", config=None,
      before=None, at_least=1)
  num_layers: int = options.key(
      description="Transformer blocks; unset: the name's", config=None,
      before=None, at_least=1)
  num_heads: int = options.key(
      description="attention heads; unset: the name's", config=None,
      before=None, at_least=1)
  mlp_dim: int = options.key(
      description="the MLPs' hidden width; unset: the name's", config=None,
      before=None, at_least=1)
  classifier: str = options.key(
      "token", '"token", "gap" or "map"; unset: init_from\'s, else "token"',
      config=None)
  representation_size: Optional[int] = options.key(
      None, "a tanh pre-logits layer of this width (pre-training); unset: "
      "none", at_least=1)
  dropout_rate: float = options.key(
      0.0, "dropout after the position embedding, in the MLPs and on the "
      "residual branches", at_least=0.0, below=1.0)
  attention_dropout_rate: float = options.key(
      0.0, "dropout on the attention weights", at_least=0.0, below=1.0)
  dtype: str = options.key(
      "float32", "what the model computes in: float32 or bfloat16")
  param_dtype: str = options.key(
      "float32", "what the params are kept in; unset: float32", config=None,
      before=None)
  remat_policy: str = options.key(
      "", "what each block's backward keeps, the rest recomputed "
      "(models.REMAT_POLICIES); '': all; auto: all where it fits",
      config="auto", changeable=True, before="")
  scan_layers: bool = options.key(
      False, "one block applied by nn.scan, its params stacked: one block "
      "compiled, not num_layers", before=options.AS_DEFAULT)
  attention: str = options.key(
      "einsum", '"einsum" (weights kept for figures), "fused" (cuDNN\'s on '
      'GPUs), "splash" (Pallas\'s on TPUs); auto: fused on GPUs',
      config="auto", changeable=True, before="einsum")
  posemb: str = options.key(
      "learn", '"learn", "learn2d", "sincos2d" or "none" (Appendix D.4); '
      "unset: init_from's where it says, else learn", config=None,
      before="learn")
  rope: str = options.key(
      "", '2-D rotary embeddings: "axial" (DINOv3\'s), "index" or "mixed" '
      "(timm's RoPE ViTs'); unset: init_from's, else none", config=None,
      before="")
  rope_theta: float = options.key(
      100.0, "RoPE's longest period (axial: in half-images; index: "
      "patches; mixed: its start); unset: init_from's, else 100",
      config=None, at_least=1.0,
      before=100.0)
  rope_shift: Optional[float] = options.key(
      None, "in training, each image's RoPE coordinates shifted by a draw "
      "in [-shift, shift] per axis; unset: not", at_least=0.0,
      changeable=True, before=None)
  rope_jitter: Optional[float] = options.key(
      None, "in training, each axis's RoPE coordinates scaled by a "
      "log-uniform draw in [1/jitter, jitter]; unset: not", at_least=1.0,
      changeable=True, before=None)
  rope_rescale: Optional[float] = options.key(
      None, "in training, both axes' RoPE coordinates scaled by one "
      "log-uniform draw in [1/rescale, rescale]; unset: not", at_least=1.0,
      changeable=True, before=None)
  resnet_stages: Optional[tuple] = options.key(
      None, "a hybrid's ResNet units per stage, e.g. (3, 4, 9) for "
      "R50+B/16; unset: the name's", before=None)
  resnet_width: int = options.key(
      64, "a hybrid's ResNet base width; unset: 64", config=None,
      before=None, at_least=1)
  layer_norm_epsilon: float = options.key(
      1e-6, "the LayerNorms' epsilon; unset: init_from's, else 1e-6",
      config=None, before=1e-6)
  gelu: str = options.key(
      "tanh", '"tanh" or "exact"; unset: init_from\'s, else "tanh"',
      config=None, before="tanh")
  final_norm: str = options.key(
      "tokens", '"tokens" or "pooled"; unset: init_from\'s, else "tokens"',
      config=None, before="tokens")
  head_bias_init: float = options.key(
      0.0, "the head's initial bias (-10 starts a sigmoid loss with every "
      "class improbable)", before=options.AS_DEFAULT)
  layer_scale: Optional[float] = options.key(
      None, "the initial value of a per-channel scale on each residual "
      "branch; unset: init_from's, else none", before=None)
  num_registers: int = options.key(
      0, "register tokens after the class token; unset: init_from's, else 0",
      config=None, before=0, at_least=0)
  distill_token: bool = options.key(
      False, "DeiT's distillation token, with a head of its own (logits: "
      "the two heads' mean); unset: init_from's, else off", config=None,
      before=False)
  qk_norm: bool = options.key(
      False, "a LayerNorm over each head's queries and keys; unset: "
      "init_from's, else off", config=None, before=False)
  key_bias: bool = options.key(
      True, "a bias on the attention's keys (DINOv3 has none); unset: "
      "init_from's, else on", config=None, before=True)
  mlp: str = options.key(
      "gelu", '"gelu" or "swiglu" (SiLU(x W_gate) * x W_0, the largest '
      'DINOv3s\'); unset: init_from\'s, else "gelu"', config=None,
      before="gelu")
  fp8: bool = options.key(
      False, "the blocks' dense matmuls in float8 (e4m3; gradients e5m2), "
      "for GPUs with float8 tensor cores (docs/models.md)",
      changeable=True, before=options.AS_DEFAULT)

  @property
  def class_token(self):
    return self.classifier == "token"

  @property
  def embedded_prefix_tokens(self):
    """Tokens before the patches that get a position embedding: the class
    and distillation tokens."""
    return int(self.class_token) + int(self.distill_token)

  @property
  def num_prefix_tokens(self):
    """Tokens before the patches: the class and distillation tokens and
    the registers."""
    return self.embedded_prefix_tokens + self.num_registers

  @property
  def rope_augmentation(self):
    return rope_lib.Augmentation(self.rope_shift, self.rope_jitter,
                                 self.rope_rescale)


CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(ViTConfig))


def _dot_general(config):
  """What the encoder blocks' dense layers multiply with: None (flax's
  default) or float8's."""
  return fp8_lib.dot_general if config.fp8 else None


def _init(initializer, axes):
  return nn.with_logical_partitioning(initializer, axes)


def _layer_norm(name, config):
  return nn.LayerNorm(
      epsilon=config.layer_norm_epsilon, dtype=config.dtype,
      param_dtype=config.param_dtype,
      scale_init=_init(nn.initializers.ones, ("embed",)),
      bias_init=_init(nn.initializers.zeros, ("embed",)),
      name=name)


class Attention(nn.Module):
  """Multi-head attention of `x`'s tokens to `kv`'s (default: `x`'s own);
  q/k/v kernels are (D, heads, D/heads). `record`: keep the weights for the
  Section 4.5 figures (the blocks' attention, not a pooling head's).
  `mask` [N, keys] bool: the keys that may be attended to (NaFlex's real
  tokens, which come first); or [N, queries, keys], the keys each query
  may attend to (a MAP probe's of a packed sequence); or a
  naflex.Segments, each token attending to its own segment's (a packed
  sequence's images, naflex.Packed); or None for all. `rope` [N or 1,
  patches, head_dim / 2]: the angles that turn the
  patches' queries and keys (the last tokens; models/rope.py); for rope
  "mixed", the patches' index coordinates [N or 1, patches, 2], which
  this block's own frequencies turn into angles; or None."""
  config: ViTConfig
  record: bool = True

  @nn.compact
  def __call__(self, x, *, train, kv=None, mask=None, rope=None):
    config = self.config
    width = x.shape[-1]
    head_dim = width // config.num_heads
    if rope is not None and config.rope == "mixed":
      frequencies = self.param(
          "rope_freqs", _init(functools.partial(
              rope_lib.init_mixed, theta=config.rope_theta),
                              (None, "heads", None)),
          (2, config.num_heads, head_dim // 2), jnp.float32)
      rope = rope_lib.mixed_angles(rope, frequencies)

    def project(name):
      # Without RoPE a key bias shifts each query's logits by a constant,
      # which softmax ignores; with RoPE it does not, so a model whose
      # source has none (DINOv3) must not train one.
      y = nn.DenseGeneral(
          (config.num_heads, head_dim), dtype=config.dtype,
          param_dtype=config.param_dtype,
          use_bias=name != "key" or config.key_bias,
          kernel_init=_init(nn.initializers.xavier_uniform(),
                            ("embed", "heads", "kv")),
          bias_init=_init(nn.initializers.zeros, ("heads", "kv")),
          dot_general=_dot_general(config),
          name=name)(x if name == "query" or kv is None else kv)
      if config.qk_norm and name != "value":
        y = nn.LayerNorm(
            epsilon=config.layer_norm_epsilon, dtype=config.dtype,
            param_dtype=config.param_dtype,
            scale_init=_init(nn.initializers.ones, ("kv",)),
            bias_init=_init(nn.initializers.zeros, ("kv",)),
            name=f"{name}_norm")(y)
      if rope is not None and name != "value":
        y = rope_lib.rotate(y, rope)
      return y

    if isinstance(mask, naflex.Segments):
      if config.attention != "splash":  # The kernel takes the ids alone.
        mask = mask.dense()  # Every token has its own segment's: none empty.
    elif mask is not None:
      # A query with no key to attend to (a batch's empty row, an empty
      # slot's probe) attends to every key: nothing reads its output, and a
      # row of masked logits alone gives NaN once XLA has rearranged the
      # softmax.
      mask = mask | ~mask.any(-1, keepdims=True)
    fused = {"fused": _fused_attention,
             "splash": splash.attention}.get(config.attention)
    if fused:
      out = fused(project("query"), project("key"), project("value"), mask)
      return _attention_out(out, width, config)

    # Heads before tokens, [..., heads, tokens, head_dim], for both
    # batched matmuls: left to itself, XLA:CPU lays weights.v out with the
    # tokens last and runs it far below its matmul rate
    # (docs/speed_on_cpu.md). On TPU the layout is XLA's to choose either way.
    q, k, v = (jnp.swapaxes(project(name), -2, -3)
               for name in ("query", "key", "value"))
    # Softmax in float32 whatever the compute dtype: bf16 logits lose the
    # small differences that attention depends on.
    logits = jnp.einsum("...hqd,...hkd->...hqk", q, k).astype(jnp.float32)
    if mask is not None:
      # Masked keys' logits pushed to the lowest finite value, by a bias the
      # same for every head.
      logits = logits + _heads_axis(jnp.where(
          mask, 0.0, jnp.finfo(jnp.float32).min))
    weights = nn.softmax(logits / jnp.sqrt(head_dim).astype(jnp.float32))
    if self.record:  # The Section 4.5 figures: distance, rollout.
      self.sow("intermediates", "attention_weights", weights)
    weights = nn.Dropout(config.attention_dropout_rate)(
        weights, deterministic=not train)
    out = jnp.einsum("...hqk,...hkd->...hqd", weights.astype(config.dtype), v)
    return _attention_out(jnp.swapaxes(out, -2, -3), width, config)


def _attention_out(out, width, config):
  """[..., tokens, heads, head_dim] -> [..., tokens, width]."""
  return nn.DenseGeneral(
      width, axis=(-2, -1), dtype=config.dtype,
      param_dtype=config.param_dtype,
      kernel_init=_init(nn.initializers.xavier_uniform(),
                        ("heads", "kv", "embed")),
      bias_init=_init(nn.initializers.zeros, ("embed",)),
      dot_general=_dot_general(config),
      name="out")(out)


def _heads_axis(mask):
  """A [N, keys] or [N, queries, keys] mask (or bias) as [N, 1, queries or
  1, keys], the same for every head."""
  return mask[:, None, None, :] if mask.ndim == 2 else mask[:, None]


def _fused_attention(query, keys, values, mask=None):
  """jax.nn.dot_product_attention of [N, tokens, heads, head_dim] inputs:
  cuDNN's kernel where it runs (NVIDIA GPUs, half precision, no mask or
  the real keys first), else XLA's. `mask`: Attention's."""
  if jax.default_backend() != "gpu" or query.dtype not in (
      jnp.bfloat16, jnp.float16) or (mask is not None and mask.ndim == 3):
    return jax.nn.dot_product_attention(
        query, keys, values, implementation="xla",
        mask=None if mask is None else _heads_axis(mask))
  # cuDNN trains on even token counts only (a ViT has 197 tokens): pad the
  # queries and keys with one token each, masked out, and drop its output.
  tokens, key_tokens = query.shape[1], keys.shape[1]

  def even(x):
    return jnp.pad(x, [(0, 0), (0, x.shape[1] % 2), (0, 0), (0, 0)])

  batch = query.shape[0]
  key_lengths = (jnp.full((batch,), key_tokens, jnp.int32) if mask is None
                 else mask.sum(-1).astype(jnp.int32))
  out = jax.nn.dot_product_attention(
      even(query), even(keys), even(values),
      query_seq_lengths=jnp.full((batch,), tokens, jnp.int32),
      key_value_seq_lengths=key_lengths, implementation="cudnn")
  return out[:, :tokens]


class MlpBlock(nn.Module):
  """Dense -> GELU (`gelu`: "tanh", the release's approximation, or
  "exact") -> Dense; or, `mlp` "swiglu", SiLU(x W_gate) * (x W_0) ->
  Dense, with the gate beside Dense_0 as `Dense_gate`."""
  config: ViTConfig

  @nn.compact
  def __call__(self, x, *, train):
    config = self.config
    width = x.shape[-1]
    dense = lambda features, axes, name: nn.Dense(
        features, dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=_init(nn.initializers.xavier_uniform(), axes),
        bias_init=_init(nn.initializers.normal(stddev=1e-6), axes[-1:]),
        dot_general=_dot_general(config),
        name=name)
    if config.mlp == "swiglu":
      gate = dense(config.mlp_dim, ("embed", "mlp"), "Dense_gate")(x)
      x = nn.silu(gate) * dense(config.mlp_dim, ("embed", "mlp"),
                                "Dense_0")(x)
    else:
      x = dense(config.mlp_dim, ("embed", "mlp"), "Dense_0")(x)
      x = nn.gelu(x, approximate=config.gelu == "tanh")
    x = nn.Dropout(config.dropout_rate)(x, deterministic=not train)
    x = dense(width, ("mlp", "embed"), "Dense_1")(x)
    return nn.Dropout(config.dropout_rate)(x, deterministic=not train)


class EncoderBlock(nn.Module):
  """Pre-LN block: z' = MSA(LN(z)) + z; z = MLP(LN(z')) + z'.

  Returns (z, None), the form nn.scan takes; `train` is positional so that
  nn.remat can hold it static. `mask`: Attention's, the keys each token
  may attend to (NaFlex's, a packed sequence's), or None; `rope`: the
  patches' RoPE angles, or None.
  """
  config: ViTConfig

  @nn.compact
  def __call__(self, x, train, mask=None, rope=None):
    # Each block's input split over the batch like the batch itself: left
    # to itself, XLA may replicate the batch inside a layer scan rather than
    # gather a weight, and need tens of GiB per device.
    x = sharding.constrain(x, ("batch", "tokens", "embed"))
    # One counter across module types, as in the release files.
    y = _layer_norm("LayerNorm_0", self.config)(x)
    y = Attention(config=self.config, name="MultiHeadDotProductAttention_1")(
        y, train=train, mask=mask, rope=rope)
    y = nn.Dropout(self.config.dropout_rate)(y, deterministic=not train)
    x = x + self._scaled("ls1", y)
    y = _layer_norm("LayerNorm_2", self.config)(x)
    y = MlpBlock(config=self.config, name="MlpBlock_3")(y, train=train)
    return x + self._scaled("ls2", y), None

  def _scaled(self, name, y):
    """A residual branch times its layer scale, where the config has one."""
    config = self.config
    if config.layer_scale is None:
      return y
    scale = self.param(name, _init(nn.initializers.constant(
        config.layer_scale), ("embed",)), (y.shape[-1],), config.param_dtype)
    return y * scale.astype(y.dtype)


def sincos2d_table(rows, cols, width, temperature=10_000.0):
  """[rows * cols, width] fixed embeddings, row-major over the patch grid
  (`sincos2d`'s)."""
  row, col = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
  return sincos2d(row.reshape(-1), col.reshape(-1), width, temperature,
                  xp=np).astype(np.float32)


def sincos2d(row, col, width, temperature=10_000.0, xp=jnp):
  """[..., width] fixed embeddings of patches at (row, col): sines and
  cosines of the row index, then of the column index, at width/4
  geometrically spaced frequencies each. `xp`: numpy or jax.numpy."""
  if width % 4:
    raise errors.InputError(
        f"posemb 'sincos2d' needs a hidden_size divisible by 4, "
        f"got {width}")
  omega = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))
  angles = [xp.asarray(index)[..., None] * omega for index in (row, col)]
  return xp.concatenate([f(a) for a in angles for f in (xp.sin, xp.cos)],
                        axis=-1)


class AddPositionEmbedding(nn.Module):
  """Adds position embeddings to [N, extra + rows * cols, D] tokens, the
  `extra` (class and distillation) tokens first and the patches row-major.

  kind (Appendix D.4):
    "learn": one learned [1, tokens, D] table, as in the released models.
    "learn2d": a learned row table [rows, D/2] and column table
      [cols, D - D/2]; a patch's embedding is its row's and its column's,
      concatenated. Each extra token has its own learned vector.
    "sincos2d": fixed, `sincos2d_table`; zero for the extra tokens.
    "none": nothing is added.
  grid: (rows, cols) of the patch grid; only the 2-D kinds read it.

  A NaFlex batch (`naflex_grid`, [N, 2], each image's rows and cols, and
  `class_tokens` extra tokens before the patches) has no grid of its own: the learned
  tables, made at a square image size, are resized to each image's grid
  (naflex.position_weights), and "sincos2d" is computed at each patch's
  place.
  """
  kind: str = "learn"
  grid: Optional[tuple] = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, naflex_grid=None, class_tokens=0, packed=None):
    _, tokens, width = x.shape
    init = nn.initializers.normal(stddev=0.02)
    if self.kind == "none":
      return x
    if packed is not None:
      grids = packed.token_grids().astype(jnp.float32)
      return x + self._resized(
          x, packed.positions[..., 0], packed.positions[..., 1],
          grids[..., 0], grids[..., 1], class_tokens,
          packed.slots).astype(x.dtype)
    if naflex_grid is not None:
      rows, cols = naflex.patch_positions(naflex_grid, tokens - class_tokens)
      grid = naflex_grid.astype(jnp.float32)
      return x + self._resized(x, rows, cols, grid[:, :1], grid[:, 1:],
                               class_tokens).astype(x.dtype)
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

  def _resized(self, x, rows, cols, grid_rows, grid_cols, class_tokens,
               slots=1):
    """[N, tokens, D] float32 embeddings of a NaFlex or packed batch's
    tokens: `slots` groups of `class_tokens` extra tokens, then patches at
    (`rows`, `cols`) [N, L] of grids of `grid_rows` x `grid_cols` (float
    [N, L], or [N, 1] for one image a row)."""
    n, tokens, width = x.shape
    if self.kind == "sincos2d":
      patches = sincos2d(rows, cols, width)
      token = jnp.zeros((class_tokens, width))
    elif self.kind == "learn":
      table = self._trained("pos_embedding", (None, None, "embed"))[0]
      side = grid_side(table.shape[0] - class_tokens,
                       "the position table a NaFlex batch resizes")
      token, square = table[:class_tokens], table[class_tokens:]
      # Each patch's weight on every entry of the table, [N, L, side^2],
      # then one matmul, so that XLA:CPU builds no [N, L, side, D]
      # intermediate (docs/naflex.md).
      weights = (naflex.position_weights(rows, grid_rows, side)[..., None]
                 * naflex.position_weights(cols, grid_cols, side)[
                     ..., None, :])
      patches = weights.reshape(n, -1, side * side) @ square
    else:  # "learn2d"
      row, col = (self._trained(f"{name}_embedding", (None, None))
                  for name in ("row", "col"))
      patches = jnp.concatenate([
          naflex.position_weights(rows, grid_rows, row.shape[0]) @ row,
          naflex.position_weights(cols, grid_cols, col.shape[0]) @ col],
                                axis=-1)
      token = (self._trained("token_embedding", (None, None))
               if class_tokens else jnp.zeros((0, width)))
    token = jnp.broadcast_to(jnp.tile(token.astype(jnp.float32), (slots, 1)),
                             (n, slots * class_tokens, width))
    return jnp.concatenate([token, patches.astype(jnp.float32)], axis=1)

  def _trained(self, name, axes):
    """A learned table as float32, at the shape its params already have: a
    NaFlex batch cannot say what size it was made at."""
    existing = self.get_variable("params", name)
    if existing is None:
      raise errors.InputError(
          f"a NaFlex batch resizes the position table {name!r}, which the "
          "params lack: initialise the model with square images (the run's "
          "image_size), then apply it to patches")
    shape = np.shape(nn.meta.unbox(existing))
    return self.param(name, _init(nn.initializers.zeros, axes), shape,
                      self.param_dtype).astype(jnp.float32)


def grid_side(num_patches, what="the patches"):
  """g for a square g x g grid of `num_patches`; an InputError naming `what`
  holds them otherwise."""
  side = int(round(np.sqrt(num_patches)))
  if side * side != num_patches:
    raise errors.InputError(
        f"{what}: {num_patches} patch positions do not form a "
        "square grid")
  return side


class Encoder(nn.Module):
  """Position embedding, then `num_layers` blocks (scanned and
  rematerialised as the config says) and a final LayerNorm (unless
  `final_norm` is "pooled": then the head normalises what it reads)."""
  config: ViTConfig

  @nn.compact
  def __call__(self, x, *, train, grid=None, naflex_grid=None, packed=None):
    """x: [N, tokens, D]; grid: the (rows, cols) of its patches; for a
    NaFlex batch, naflex_grid [N, 2] instead, each image's; for a packed
    one (naflex.Packed, whose slots each have their prefix tokens first in
    x), `packed`."""
    config = self.config
    x = AddPositionEmbedding(kind=config.posemb, grid=grid,
                             param_dtype=config.param_dtype,
                             name="posembed_input")(
                                 x, naflex_grid, config.embedded_prefix_tokens,
                                 packed)
    rope = self._rope_angles(x, train, grid, naflex_grid, packed)
    mask = None
    slots = 1 if packed is None else packed.slots
    if packed is not None:  # Each token attends to its own image's.
      mask = packed.attention_mask(config.embedded_prefix_tokens,
                                   config.num_registers)
    if naflex_grid is not None:  # The real tokens: the prefix and patches.
      n, tokens, _ = x.shape
      mask = jnp.concatenate([
          jnp.ones((n, config.num_prefix_tokens), bool),
          naflex.patch_mask(naflex_grid,
                            tokens - config.embedded_prefix_tokens)],
                             axis=1)
    if config.num_registers:
      registers = self.param(
          "registers", _init(nn.initializers.normal(stddev=0.02),
                             (None, None, "embed")),
          (1, config.num_registers, x.shape[-1]), config.param_dtype)
      registers = jnp.tile(registers.astype(x.dtype), (x.shape[0], slots, 1))
      first = config.embedded_prefix_tokens * slots
      x = jnp.concatenate([x[:, :first], registers, x[:, first:]], axis=1)
    x = nn.Dropout(config.dropout_rate)(x, deterministic=not train)
    block = EncoderBlock
    if config.remat_policy:
      # Argument 2 (after the module and x) is `train`, a Python bool.
      # Inside a scan, XLA cannot merge the recomputation away, so the CSE
      # barriers that nn.remat adds by default would only cost.
      block = nn.remat(block, policy=REMAT_POLICIES[config.remat_policy],
                       prevent_cse=not config.scan_layers, static_argnums=(2,))
    if config.scan_layers:
      block = nn.scan(
          block, variable_axes={"params": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=nn.broadcast, length=config.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = block(config=config, name="encoderblock")(x, train, mask, rope)
    else:
      for i in range(config.num_layers):
        x, _ = block(config=config, name=f"encoderblock_{i}")(
            x, train, mask, rope)
    if config.final_norm == "pooled":
      return x
    return _layer_norm("encoder_norm", config)(x)

  def _rope_angles(self, x, train, grid, naflex_grid, packed):
    """[N or 1, patches, head_dim / 2] RoPE angles of x's patches (each
    image's own grid for a NaFlex or packed batch; augmented in training
    where the config says), or None without RoPE; for rope "mixed", whose
    angles each block makes, the coordinates [N or 1, patches, 2]."""
    config = self.config
    if not config.rope:
      return None
    patches = x.shape[1] - config.embedded_prefix_tokens
    images, count = None, 1  # Whose draw each patch takes: its row's.
    if packed is not None:
      grids = packed.token_grids()
      images, count = jnp.maximum(packed.segments - 1, 0), packed.slots
      coords = rope_lib.coordinates(
          packed.positions[..., 0], packed.positions[..., 1], grids[..., 0],
          grids[..., 1], config.rope)
    elif naflex_grid is None:
      rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]),
                               indexing="ij")
      coords = rope_lib.coordinates(rows.reshape(1, -1), cols.reshape(1, -1),
                                    grid[0], grid[1], config.rope)
    else:
      rows, cols = naflex.patch_positions(naflex_grid, patches)
      coords = rope_lib.coordinates(rows, cols, naflex_grid[:, :1],
                                    naflex_grid[:, 1:], config.rope)
    if train and config.rope_augmentation.any:
      coords = rope_lib.augment(
          jnp.broadcast_to(coords, (x.shape[0],) + coords.shape[1:]),
          config.rope_augmentation, self.make_rng("dropout"), images, count)
    if config.rope == "mixed":
      return coords
    return rope_lib.angles(coords, config.hidden_size // config.num_heads,
                           config.rope_theta, config.rope)


def unit_range(images):
  """uint8 images, as the input pipeline ships them, scaled to [-1, 1] in
  float32 (the released checkpoints' range); float images are taken to be
  in that range already."""
  if images.dtype == jnp.uint8:
    return images.astype(jnp.float32) / 127.5 - 1
  return images


class ImageEncoder(nn.Module):
  """Images to encoded tokens [N, tokens, D], what every head reads.

  uint8 images are scaled to [-1, 1] here, on the device; an optional BiT
  ResNet stem; the patch embedding; for masked patch prediction, a learned
  [mask] embedding that a `corruption` puts in when `mask_token`; the
  class token first for classifier "token", and the distillation token
  after it; then the Encoder.

  A NaFlex batch (naflex.Patches) in place of images: each patch is
  embedded by the same convolution, and the Encoder is told each image's
  grid. A packed one (naflex.Packed): the same, with each slot's prefix
  tokens, slot after slot, before the patches.
  """
  config: ViTConfig
  mask_token: bool

  @nn.compact
  def __call__(self, images, *, train, corruption=None):
    config = self.config
    slots = 1
    if isinstance(images, (naflex.Packed, naflex.Patches)):
      x = _patch_embedding(self, unit_range(images.pixels).astype(
          config.dtype))
      if isinstance(images, naflex.Packed):
        grid, slots = dict(packed=images), images.slots
      else:
        grid = dict(naflex_grid=images.grid)
    else:
      x = unit_range(images).astype(config.dtype)
      if config.resnet_stages is not None:
        x = resnet.stem(x, stages=config.resnet_stages,
                        width=config.resnet_width, dtype=config.dtype,
                        param_dtype=config.param_dtype)
      p = config.patch_size
      x = nn.Conv(
          config.hidden_size, (p, p), strides=(p, p), padding="VALID",
          dtype=config.dtype, param_dtype=config.param_dtype,
          kernel_init=_init(nn.initializers.lecun_normal(),
                            (None, None, None, "embed")),
          bias_init=_init(nn.initializers.zeros, ("embed",)),
          name="embedding")(x)
      _, h, w, _ = x.shape
      x = x.reshape(x.shape[0], h * w, -1)
      grid = dict(grid=(h, w))
    n, _, d = x.shape
    if self.mask_token:
      mask = self.param(
          "mask_embedding", _init(nn.initializers.normal(stddev=0.02),
                                  (None, None, "embed")),
          (1, 1, d), config.param_dtype)
      if corruption is not None:
        x = mpp_lib.apply(corruption, x, mask)
    prefix = []
    if config.class_token:
      prefix.append(self.param(
          "cls", _init(nn.initializers.zeros, (None, None, "embed")),
          (1, 1, d), config.param_dtype))
    if config.distill_token:
      # Drawn, not zero as the class token is: the two then differ from the
      # first step, as in DeiT.
      prefix.append(self.param(
          "dist", _init(nn.initializers.normal(stddev=0.02),
                        (None, None, "embed")), (1, 1, d), config.param_dtype))
    if prefix:
      prefix = jnp.concatenate([token.astype(x.dtype) for token in prefix],
                               axis=1)
      x = jnp.concatenate([jnp.tile(prefix, (n, slots, 1)), x], axis=1)
    return Encoder(config=config, name="Transformer")(x, train=train, **grid)


def _patch_embedding(encoder, patches):
  """The embedding convolution's function on flattened patches [N, L,
  p * p * 3], as one matmul with its kernel [p, p, 3, D] flattened in the
  same order, which XLA:CPU runs faster than a convolution over N * L
  patches (docs/naflex.md). The params are made by square images, as
  every position table is."""
  params = encoder.variables.get("params", {}).get("embedding")
  if params is None:
    raise errors.InputError(
        "a NaFlex batch needs the patch embedding's params: initialise the "
        "model with square images (the run's image_size), then apply it to "
        "patches")
  kernel, bias = (nn.meta.unbox(params[name]) for name in ("kernel", "bias"))
  dtype = encoder.config.dtype
  return (patches @ kernel.reshape(-1, kernel.shape[-1]).astype(dtype)
          + bias.astype(dtype))


class ClassifierHead(nn.Module):
  """Encoded tokens -> float32 logits [N, num_classes]: the class token
  ("token") or the mean of the tokens ("gap"), normalised when `final_norm`
  is "pooled" (timm's fc_norm), an optional tanh pre-logits layer of
  `representation_size`, and a zero-initialised linear head.
  `patch_mask` [N, patches]: a NaFlex batch's real patches, the only ones
  pooled. With a distillation token, the class and distillation tokens
  each go through the same layers to a head of their own (`head`,
  `head_dist`): the logits are the heads' mean, or with `both_heads` the
  pair (class head's, distillation head's); the features are the mean of
  what the two heads read. A packed batch (naflex.Packed) is pooled image
  by image, [N, K, ...]: each slot's class token, its patches' mean, or
  its own probe over its patches."""
  num_classes: int
  config: ViTConfig

  @nn.compact
  def __call__(self, x, patch_mask=None, both_heads=False, packed=None):
    config = self.config
    slots = 1 if packed is None else packed.slots
    patches = x[:, config.num_prefix_tokens * slots:]
    # [N, L, K]: which of a packed batch's patches each slot's image holds.
    member = None if packed is None else (
        packed.segments[..., None] == jnp.arange(1, slots + 1))
    if packed is not None and config.classifier == "token":
      prefix = x[:, :config.embedded_prefix_tokens * slots].reshape(
          x.shape[0], slots, config.embedded_prefix_tokens, x.shape[-1])
      x = prefix[:, :, :2] if config.distill_token else prefix[:, :, 0]
    elif packed is not None and config.classifier == "map":
      x = MAPHead(config=config, name="MAPHead_0")(
          patches, jnp.swapaxes(member, 1, 2), slots)
    elif packed is not None:  # "gap": each image's patches' mean.
      weights = member.astype(patches.dtype)
      x = jnp.einsum("nlk,nld->nkd", weights, patches) / jnp.maximum(
          weights.sum(1), 1)[..., None]
    elif config.distill_token:
      x = x[:, :2]  # [N, 2, D]: the layers below act on each token alone.
    elif config.classifier == "token":
      x = x[:, 0]
    elif config.classifier == "map":
      x = MAPHead(config=config, name="MAPHead_0")(patches, patch_mask)
    elif patch_mask is None:
      x = patches.mean(axis=1)
    else:
      count = jnp.maximum(patch_mask.sum(1, keepdims=True), 1)
      x = jnp.where(patch_mask[..., None], patches, 0).sum(1) / count.astype(
          patches.dtype)
    if config.final_norm == "pooled":
      x = _layer_norm("fc_norm", config)(x)
    if config.representation_size is not None:
      x = nn.Dense(
          config.representation_size, dtype=config.dtype,
          param_dtype=config.param_dtype,
          kernel_init=_init(nn.initializers.lecun_normal(), ("embed", "mlp")),
          bias_init=_init(nn.initializers.zeros, ("mlp",)),
          name="pre_logits")(x)
      x = nn.tanh(x)
    # What the head reads (the pre-logits): few-shot evaluation fits its own
    # linear classifiers to these.
    self.sow("intermediates", "features",
             x.mean(axis=-2) if config.distill_token else x)
    # A zero kernel: a fresh head predicts the same for every image.
    head = lambda name, features: nn.Dense(
        self.num_classes, dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=_init(nn.initializers.zeros, (None, "classes")),
        bias_init=_init(nn.initializers.constant(config.head_bias_init),
                        ("classes",)),
        name=name)(features).astype(jnp.float32)
    if not config.distill_token:
      return head("head", x)
    pair = head("head", x[..., 0, :]), head("head_dist", x[..., 1, :])
    return pair if both_heads else (pair[0] + pair[1]) / 2


def logits_and_pre_logits(model, params, images):
  """(logits, pre-logits) of a VisionTransformer on `images`, evaluated:
  what its head gives, and what its head reads (ClassifierHead sows it)."""
  logits, state = model.apply({"params": params}, images, train=False,
                              mutable=["intermediates"])
  (pre_logits,) = state["intermediates"]["features"]
  return logits, pre_logits


class MAPHead(nn.Module):
  """Multi-head attention pooling: a learned probe attends to the tokens,
  then a residual MLP on what it gathered (big_vision's MAPHead, the
  layout of SigLIP's image tower). `mask`: Attention's; a packed batch
  has `slots` copies of the probe, each attending to its image's patches
  ([N, slots, patches]), and gives [N, slots, D]."""
  config: ViTConfig

  @nn.compact
  def __call__(self, x, mask=None, slots=None):
    config = self.config
    probe = self.param("probe", _init(nn.initializers.xavier_uniform(),
                                      (None, None, "embed")),
                       (1, 1, x.shape[-1]), config.param_dtype)
    probe = jnp.tile(probe.astype(x.dtype), (x.shape[0], slots or 1, 1))
    # big_vision's and timm's pooling normalise no queries or keys.
    # One query token: the fused kernel has nothing to gain here.
    head = dataclasses.replace(config, fp8=False)
    y = Attention(config=dataclasses.replace(head, qk_norm=False,
                                             key_bias=True,
                                             attention="einsum"),
                  record=False, name="MultiHeadDotProductAttention_0")(
                      probe, train=False, kv=x, mask=mask)
    z = _layer_norm("LayerNorm_0", config)(y)
    y = y + MlpBlock(config=head, name="MlpBlock_0")(z, train=False)
    return y if slots else y[:, 0]


class PatchColourHead(nn.Module):
  """Encoded tokens -> float32 logits [N, patches, 512]: each patch token's
  prediction of its patch's mean colour (vit_jax/models/masked_patches.py).
  """
  config: ViTConfig

  @nn.compact
  def __call__(self, x):
    config = self.config
    patches = x[:, config.num_prefix_tokens:]
    return nn.Dense(
        mpp_lib.NUM_CLASSES, dtype=config.dtype,
        param_dtype=config.param_dtype,
        kernel_init=_init(nn.initializers.zeros, (None, "classes")),
        bias_init=_init(nn.initializers.zeros, ("classes",)),
        name="mpp_head")(patches).astype(jnp.float32)


class VisionTransformer(nn.Module):
  """ViT classifier: an ImageEncoder read by a ClassifierHead. Images are
  NHWC in [-1, 1], or uint8 in [0, 255]; returns float32 logits. Its
  settings are its `config`'s (`model.config.num_heads`).

  The encoder and the head share this module's scope (`nn.share_scope`),
  so the params are the release layout: embedding, cls, Transformer,
  pre_logits, head.
  """
  num_classes: int
  config: ViTConfig

  @property
  def token_stride(self):
    """Image pixels per token along a side: the patch size, times what a
    hybrid's stem shrinks the image by (4 x 2^(stages - 1))."""
    config = self.config
    if config.resnet_stages is None:
      return config.patch_size
    return config.patch_size * resnet.reduction(config.resnet_stages)

  def describe_patch(self):
    """'patch size 16', and for a hybrid what the stem multiplies it by."""
    patch_size = self.config.patch_size
    if self.config.resnet_stages is None:
      return f"patch size {patch_size}"
    stem = self.token_stride // patch_size
    return f"patch size {patch_size} x {stem} (the ResNet stem's)"

  def setup(self):
    self.check_options()
    self.encoder = ImageEncoder(config=self.config, mask_token=False)
    nn.share_scope(self, self.encoder)
    self.classify = ClassifierHead(num_classes=self.num_classes,
                                   config=self.config)
    nn.share_scope(self, self.classify)

  def __call__(self, images, *, train, both_heads=False):
    """images: NHWC, or a NaFlex batch (naflex.Patches), or a packed one
    (naflex.Packed: logits [N, K, classes], a row per slot). `both_heads`:
    a model with a distillation token returns the pair (class head's,
    distillation head's logits) rather than their mean."""
    self.check_image_size(images)
    if isinstance(images, naflex.Packed):
      return self.classify(self.encoder(images, train=train), None,
                           both_heads, images)
    mask = None
    if isinstance(images, naflex.Patches):
      mask = naflex.patch_mask(images.grid, images.pixels.shape[1])
    return self.classify(self.encoder(images, train=train), mask, both_heads)

  @nn.nowrap
  def check_options(self):
    """InputError for options no model has; models.create calls it too."""
    config = self.config
    for field in dataclasses.fields(config):  # Their declared bounds.
      problem = options.out_of_bounds(
          field.name, getattr(config, field.name), field.metadata,
          unset_allowed=field.default is None)
      if problem:
        raise errors.InputError(problem)
    for name in ("dtype", "param_dtype"):
      try:
        floating = jnp.issubdtype(jnp.dtype(getattr(config, name)),
                                  jnp.floating)
      except TypeError:
        floating = False
      if not floating:
        raise errors.InputError(f"{name} must be a float type such as "
                                f"'float32' or 'bfloat16', got "
                                f"{getattr(config, name)!r}")
    if not config.layer_norm_epsilon > 0:  # Also refuses NaN.
      raise errors.InputError(f"layer_norm_epsilon must be > 0, got "
                              f"{config.layer_norm_epsilon!r}")
    if config.classifier not in CLASSIFIERS:
      raise errors.InputError(f"classifier must be one of {CLASSIFIERS}, got "
                              f"{config.classifier!r}")
    if config.distill_token and config.classifier != "token":
      raise errors.InputError(
          f"distill_token: the distillation token is read beside the class "
          f"token; it needs classifier 'token', got {config.classifier!r}")
    if config.layer_scale is not None and (
        isinstance(config.layer_scale, bool)
        or not isinstance(config.layer_scale, (int, float))):
      raise errors.InputError(f"layer_scale must be None or a number, got "
                              f"{config.layer_scale!r}")
    if config.attention not in ATTENTION_KINDS:
      raise errors.InputError(f"attention must be one of {ATTENTION_KINDS}, "
                              f"got {config.attention!r}")
    if config.attention != "einsum" and config.attention_dropout_rate:
      raise errors.InputError(
          f"attention {config.attention!r} takes no attention_dropout_rate; "
          "set it to 0 or use attention 'einsum'")
    if config.posemb not in POSEMB_KINDS:
      raise errors.InputError(f"posemb must be one of {POSEMB_KINDS}, got "
                              f"{config.posemb!r}")
    if config.hidden_size % config.num_heads:
      raise errors.InputError(
          f"hidden_size {config.hidden_size} is not divisible by num_heads "
          f"{config.num_heads}")
    rope_lib.check(config.rope, config.hidden_size // config.num_heads)
    if config.gelu not in GELU_KINDS:
      raise errors.InputError(f"gelu must be one of {GELU_KINDS}, got "
                              f"{config.gelu!r}")
    if config.mlp not in MLP_KINDS:
      raise errors.InputError(f"mlp must be one of {MLP_KINDS}, got "
                              f"{config.mlp!r}")
    if config.final_norm not in FINAL_NORMS:
      raise errors.InputError(f"final_norm must be one of {FINAL_NORMS}, got "
                              f"{config.final_norm!r}")
    if config.remat_policy not in REMAT_POLICIES:
      raise errors.InputError(
          f"unknown remat_policy {config.remat_policy!r}; one of "
          f"{sorted(REMAT_POLICIES)} ('' rematerialises nothing)")

  @nn.nowrap
  def check_image_size(self, images):
    if isinstance(images, (naflex.Patches, naflex.Packed)):
      return self.check_patches(images)
    height, width = images.shape[1:3]
    if height % self.token_stride or width % self.token_stride:
      raise errors.InputError(
          f"{self.describe_patch()} does not divide the image "
          f"size {height}x{width}")


  @nn.nowrap
  def check_patches(self, patches):
    config = self.config
    if config.resnet_stages is not None:
      raise errors.InputError(
          "a hybrid's ResNet stem reads whole images: it takes no NaFlex "
          "patches")
    size = config.patch_size ** 2 * 3
    if patches.pixels.ndim != 3 or patches.pixels.shape[-1] != size:
      raise errors.InputError(
          f"NaFlex patches of shape {patches.pixels.shape}: "
          f"{self.describe_patch()} takes [batch, patches, {size}]")


class MaskedPatchViT(VisionTransformer):
  """The same encoder, with a [mask] embedding, read by a PatchColourHead:
  masked patch prediction (`vit_jax/models/masked_patches.py`). Returns
  logits [N, patches, 512]; `corruption` (a masked_patches.Corruption) is
  applied to the patch embeddings. num_classes and representation_size are
  unused. Its encoder fine-tunes like any other through `init_from`, which
  drops mask_embedding and mpp_head."""

  @nn.nowrap
  def check_options(self):
    super().check_options()
    if self.config.final_norm == "pooled":
      raise errors.InputError(
          "masked patch prediction reads every token: final_norm must be "
          "'tokens'")

  def setup(self):
    self.check_options()
    self.encoder = ImageEncoder(config=self.config, mask_token=True)
    nn.share_scope(self, self.encoder)
    self.predict = PatchColourHead(config=self.config)
    nn.share_scope(self, self.predict)

  def __call__(self, images, *, train, corruption=None):
    if isinstance(images, naflex.Patches):
      raise errors.InputError("masked patch prediction takes square images, "
                              "not NaFlex patches")
    self.check_image_size(images)
    return self.predict(self.encoder(images, train=train,
                                     corruption=corruption))
