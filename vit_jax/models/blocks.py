"""The encoder's block (pre-LN attention, then the MLP, each a residual
branch) and the MLP that the block and the MAP head share."""

import flax.linen as nn
import jax

from vit_jax import sharding
from vit_jax.models import layers
from vit_jax.models.attention import Attention
from vit_jax.models.config import ViTConfig


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
        kernel_init=layers.init(nn.initializers.xavier_uniform(), axes),
        bias_init=layers.init(nn.initializers.normal(stddev=1e-6), axes[-1:]),
        dot_general=layers.dot_general(config),
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
  patches' RoPE angles, or None; `drop_path`: the rate at which training
  drops each row's residual branches (stochastic depth), 0 for none.
  """
  config: ViTConfig

  @nn.compact
  def __call__(self, x, train, mask=None, rope=None, drop_path=0.0):
    # Each block's input split over the batch like the batch itself: left
    # to itself, XLA may replicate the batch inside a layer scan rather than
    # gather a weight, and need tens of GiB per device.
    x = sharding.constrain(x, ("batch", "tokens", "embed"))
    # One counter across module types, as in the release files.
    y = layers.layer_norm("LayerNorm_0", self.config)(x)
    y = Attention(config=self.config, name="MultiHeadDotProductAttention_1")(
        y, train=train, mask=mask, rope=rope)
    y = nn.Dropout(self.config.dropout_rate)(y, deterministic=not train)
    x = x + self._dropped(self._scaled("ls1", y), drop_path, train)
    y = layers.layer_norm("LayerNorm_2", self.config)(x)
    y = MlpBlock(config=self.config, name="MlpBlock_3")(y, train=train)
    return x + self._dropped(self._scaled("ls2", y), drop_path, train), None

  def _dropped(self, y, rate, train):
    """The branch `y` [rows, ...] zeroed for a row at `rate` (a number, or
    a scanned layer's traced one), the rest scaled by 1 / (1 - rate)."""
    if not train or (isinstance(rate, float) and rate == 0.0):
      return y
    keep = 1.0 - rate
    kept = jax.random.bernoulli(self.make_rng("dropout"), keep,
                                (y.shape[0],) + (1,) * (y.ndim - 1))
    return y * (kept / keep).astype(y.dtype)

  def _scaled(self, name, y):
    """A residual branch times its layer scale, where the config has one."""
    config = self.config
    if config.layer_scale is None:
      return y
    scale = self.param(name, layers.init(nn.initializers.constant(
        config.layer_scale), ("embed",)), (y.shape[-1],), config.param_dtype)
    return y * scale.astype(y.dtype)
