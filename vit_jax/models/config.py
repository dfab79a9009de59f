"""A ViT's settings: ViTConfig, every option declared once with what it is,
and the checks a model makes of them before it is traced."""

import dataclasses
import operator
from typing import Any, Optional

import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import options, rope as rope_lib
from vit_jax.models.options import ARCHITECTURE, FUNCTION, Marks

Dtype = Any

# Where the release layout keeps the position embedding ("learn"), and where
# the "learn2d" kind keeps its row and column tables.
POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
POSEMB_2D_KEYS = ("Transformer/posembed_input/row_embedding",
                  "Transformer/posembed_input/col_embedding")
# The first block, whose params reveal the blocks' options.
BLOCK_0 = "Transformer/encoderblock_0/"
_ATTENTION_0 = BLOCK_0 + "MultiHeadDotProductAttention_1/"

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


def _name_sets(description):
  """A required size that the model's name ("B/16") sets: unset in a
  config, where the name says it."""
  return options.key(description=f"{description}; unset: the name's",
                     config=None, before=None, at_least=1)


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
  timm (vit_jax/weights/pytorch/layouts.py); final_norm "pooled" keeps the
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
  patch_size: int = _name_sets("pixels per patch side")
  hidden_size: int = _name_sets("the token width")
  num_layers: int = _name_sets("Transformer blocks")
  num_heads: int = _name_sets("attention heads")
  mlp_dim: int = _name_sets("the MLPs' hidden width")
  classifier: str = options.key(
      "token", '"token", "gap" or "map"; unset: init_from\'s, else "token"',
      config=None, choices=CLASSIFIERS, kind=ARCHITECTURE,
      marks=Marks({"cls": "token", "MAPHead_0/probe": "map"}, "gap"))
  representation_size: Optional[int] = options.key(
      None, "a tanh pre-logits layer of this width (pre-training); unset: "
      "none", at_least=1)
  dropout_rate: float = options.key(
      0.0, "dropout after the position embedding, in the MLPs and on the "
      "residual branches", at_least=0.0, below=1.0)
  attention_dropout_rate: float = options.key(
      0.0, "dropout on the attention weights", at_least=0.0, below=1.0)
  drop_path_rate: float = options.key(
      0.0, "stochastic depth: block i of L drops its branches for an image "
      "at i / (L - 1) of this",
      at_least=0.0, below=1.0, before=options.AS_DEFAULT)
  dtype: str = options.key(
      "float32", "what the model computes in: float32 or bfloat16")
  param_dtype: str = options.key(
      "float32", "what the params are kept in; unset: float32", config=None,
      before=None)
  remat_policy: str = options.key(
      "", "what each block's backward keeps, the rest recomputed "
      "(models.REMAT_POLICIES); '': all; auto: all where it fits",
      config="auto", changeable=True, before="", choices=tuple(REMAT_POLICIES))
  scan_layers: bool = options.key(
      False, "one block applied by nn.scan, its params stacked: one block "
      "compiled, not num_layers", before=options.AS_DEFAULT)
  attention: str = options.key(
      "einsum", '"einsum" (weights kept for figures), "fused" (cuDNN\'s on '
      'GPUs), "splash" (Pallas\'s on TPUs); auto: fused on GPUs',
      config="auto", changeable=True, before="einsum", choices=ATTENTION_KINDS)
  posemb: str = options.key(
      "learn", '"learn", "learn2d", "sincos2d" or "none" (Appendix D.4); '
      "unset: init_from's where it says, else learn", config=None,
      before="learn", choices=POSEMB_KINDS, kind=ARCHITECTURE,
      # No table: "sincos2d" or "none", which params do not tell apart.
      marks=Marks({POSEMB_KEY: "learn", POSEMB_2D_KEYS[0]: "learn2d"}, None))
  rope: str = options.key(
      "", '2-D rotary embeddings: "axial" (DINOv3\'s), "index" or "mixed" '
      "(timm's RoPE ViTs'); unset: init_from's, else none", config=None,
      before="", choices=rope_lib.KINDS, kind=FUNCTION)
  rope_theta: float = options.key(
      100.0, "RoPE's longest period (axial: in half-images; index: "
      "patches; mixed: its start); unset: init_from's, else 100",
      config=None, at_least=1.0, before=100.0, kind=FUNCTION)
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
      config=None, before=1e-6, kind=FUNCTION)
  gelu: str = options.key(
      "tanh", '"tanh" or "exact"; unset: init_from\'s, else "tanh"',
      config=None, before="tanh", choices=GELU_KINDS, kind=FUNCTION)
  final_norm: str = options.key(
      "tokens", '"tokens" or "pooled"; unset: init_from\'s, else "tokens"',
      config=None, before="tokens", choices=FINAL_NORMS, kind=FUNCTION,
      marks=Marks({"fc_norm/scale": "pooled"}, "tokens"))
  head_bias_init: float = options.key(
      0.0, "the head's initial bias (-10 starts a sigmoid loss with every "
      "class improbable)", before=options.AS_DEFAULT)
  layer_scale: Optional[float] = options.key(
      None, "the initial value of a per-channel scale on each residual "
      "branch; unset: init_from's, else none", before=None,
      kind=ARCHITECTURE,
      # Its initial value does not matter to params that are loaded.
      marks=Marks({BLOCK_0 + "ls1": 1.0}, None))
  num_registers: int = options.key(
      0, "register tokens after the class token; unset: init_from's, else 0",
      config=None, before=0, at_least=0, kind=ARCHITECTURE,
      marks=Marks({"Transformer/registers": operator.itemgetter(1)}, 0))
  distill_token: bool = options.key(
      False, "DeiT's distillation token, with a head of its own (logits: "
      "the two heads' mean); unset: init_from's, else off", config=None,
      before=False, kind=ARCHITECTURE, marks=Marks({"dist": True}, False))
  qk_norm: bool = options.key(
      False, "a LayerNorm over each head's queries and keys; unset: "
      "init_from's, else off", config=None, before=False, kind=ARCHITECTURE,
      marks=Marks({_ATTENTION_0 + "query_norm/scale": True}, False))
  key_bias: bool = options.key(
      True, "a bias on the attention's keys (DINOv3 has none); unset: "
      "init_from's, else on", config=None, before=True, kind=ARCHITECTURE,
      marks=Marks({_ATTENTION_0 + "key/bias": True}, False))
  mlp: str = options.key(
      "gelu", '"gelu" or "swiglu" (SiLU(x W_gate) * x W_0, the largest '
      'DINOv3s\'); unset: init_from\'s, else "gelu"', config=None,
      before="gelu", choices=MLP_KINDS, kind=ARCHITECTURE,
      marks=Marks({BLOCK_0 + "MlpBlock_3/Dense_gate/kernel": "swiglu"},
                  "gelu"))
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


def declared(kind):
  """{name: default} of ViTConfig's options of this `kind` (options.FUNCTION
  or options.ARCHITECTURE), in their declaration's order."""
  return {field.name: field.default for field in dataclasses.fields(ViTConfig)
          if field.metadata["kind"] == kind}


def revealed(flat, names):
  """{name: value} of the options `names` as release-layout params (a flat
  '/'-keyed dict of arrays or shapes) reveal them, each by its declared
  `marks`; posemb None where they hold no table."""
  fields = ViTConfig.__dataclass_fields__
  return {name: fields[name].metadata["marks"].read(flat) for name in names}


def check(config):
  """InputError for options no model has; models.create calls it too."""
  for field in dataclasses.fields(config):  # Their declared bounds, choices.
    problem = options.problem(
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
  if config.distill_token and config.classifier != "token":
    raise errors.InputError(
        f"distill_token: the distillation token is read beside the class "
        f"token; it needs classifier 'token', got {config.classifier!r}")
  if config.layer_scale is not None and (
      isinstance(config.layer_scale, bool)
      or not isinstance(config.layer_scale, (int, float))):
    raise errors.InputError(f"layer_scale must be None or a number, got "
                            f"{config.layer_scale!r}")
  if config.attention != "einsum" and config.attention_dropout_rate:
    raise errors.InputError(
        f"attention {config.attention!r} takes no attention_dropout_rate; "
        "set it to 0 or use attention 'einsum'")
  if config.hidden_size % config.num_heads:
    raise errors.InputError(
        f"hidden_size {config.hidden_size} is not divisible by num_heads "
        f"{config.num_heads}")
  rope_lib.check(config.rope, config.hidden_size // config.num_heads)
