"""Linear probing, MAE's protocol (He et al., CVPR 2022, appendix A.3):
config.objective "linear_probe".

The encoder is frozen (config.optimizer.frozen must be PROBE_FROZEN: all
but the head) and runs outside the gradient; its features (the class
token after the final norm, what the head reads) go through a batch norm
without scale or bias and then the linear head, the only thing trained.
The batch norm normalises by the micro-batch's statistics in training and
by running ones (torch's BatchNorm1d: momentum 0.1, the unbiased variance,
epsilon 1e-6) at evaluation; those are the objective's carry, updated once
per step from the whole batch. A normalisation followed by a linear layer
is one linear layer: what the run serves (evaluates, checkpoints as its
"polyak", exports) is its params with the running statistics folded into
the head, a plain classifier every tool reads.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import errors
from vit_jax.models import flops, heads
from vit_jax.training import losses
from vit_jax.training.objectives import classification

# All but the head: config.optimizer.frozen's value for a probe.
PROBE_FROZEN = "(?!head/).*"
# torch's BatchNorm1d(affine=False, eps=1e-6) as MAE's probe builds it.
EPSILON = 1e-6
MOMENTUM = 0.1
# MAE's probe head: trunc_normal_(std=0.01), whose bounds (+-2) lie 200
# standard deviations out: a normal draw.
HEAD_STD = 0.01
HEAD_STREAM = 0x68656164  # "head"


class LinearProbe(classification.Classification):
  """A linear classifier on a frozen encoder's normalised features."""

  name = "linear_probe"

  @classmethod
  def check(cls, keys):
    super().check(keys)
    name = "config.objective='linear_probe'"
    if keys.optimizer.frozen != PROBE_FROZEN:
      raise errors.ConfigError(
          f"config.optimizer.frozen must be {PROBE_FROZEN!r} with {name} "
          f"(only the head learns), got {keys.optimizer.frozen!r}")
    cls.refuse_set(name, "trains one linear layer on square images' "
                   "features", (
        ("config.model.mpp", keys.model.mpp, False),
        ("config.model.distill_token", keys.model.distill_token, False),
        ("config.model.representation_size",
         keys.model.representation_size, None),
        ("config.distill.teacher", keys.distill.teacher, ""),
        ("config.naflex.max_num_patches", keys.naflex.max_num_patches, 0),
        ("config.naflex.packing", keys.naflex.packing, False),
        ("config.polyak_decay", keys.polyak_decay, 0.0)))

  def init_params(self, rng, image_size):
    """A head drawn as MAE's probe draws it, N(0, 0.01^2): LARS scales a
    step by the weights' norm, and a zero head's first one would not be."""
    params = super().init_params(rng, image_size)
    kernel = params["head"]["kernel"]
    value = HEAD_STD * jax.random.normal(
        jax.random.fold_in(rng, HEAD_STREAM), nn.meta.unbox(kernel).shape,
        nn.meta.unbox(kernel).dtype)
    head = {**params["head"], "kernel": (
        kernel.replace_boxed(value)
        if isinstance(kernel, nn.meta.AxisMetadata) else value)}
    return {**params, "head": head}

  def init_carry(self, params):
    """Running mean 0 and variance 1, as torch starts them."""
    width = nn.meta.unbox(params["head"]["kernel"]).shape[0]
    return {"mean": jnp.zeros((width,), jnp.float32),
            "var": jnp.ones((width,), jnp.float32)}

  def teach(self, held, micro):
    """The frozen encoder's features, outside the gradient."""
    _, features = heads.logits_and_pre_logits(self.model, held.params,
                                              micro["image"])
    return {**micro, "features": features.astype(jnp.float32)}

  def loss(self, params, micro, weights, key):
    del key  # Nothing is dropped out of a linear layer.
    features = micro["features"]
    share = weights[:, None] / jnp.maximum(weights.sum(), 1e-30)
    mean = (share * features).sum(axis=0)
    var = (share * (features - mean) ** 2).sum(axis=0)
    logits = self.head(params, (features - mean) * jax.lax.rsqrt(
        var + EPSILON))
    per_image = losses.cross_entropy(self.recipe.loss, logits,
                                     micro["target"])
    return (weights * per_image).sum(), {}

  def head(self, params, normalised):
    head = nn.meta.unbox(params["head"])
    return normalised @ head["kernel"].astype(jnp.float32) + head["bias"]

  def observe(self, micro, weights):
    """The batch's weighted first and second moments of the features, and
    the sum of the squared weights (1 / the batch's count)."""
    features = micro["features"]
    return {"mean": weights @ features, "square": weights @ features ** 2,
            "inverse_count": (weights ** 2).sum()}

  def update_carry(self, carry, observed, step, served):
    del step, served
    count = 1 / jnp.maximum(observed["inverse_count"], 1e-30)
    mean = observed["mean"]
    biased = jnp.maximum(observed["square"] - mean ** 2, 0)
    var = biased * count / jnp.maximum(count - 1, 1)
    return {"mean": (1 - MOMENTUM) * carry["mean"] + MOMENTUM * mean,
            "var": (1 - MOMENTUM) * carry["var"] + MOMENTUM * var}

  def flops_per_image(self, image_size, num_patches=None, slots=1):
    """The encoder's forward only: nothing flows back through it."""
    return flops.flops_per_image(self.model, image_size, train=False)

  def init_served(self, params, carry, decay):
    del decay
    return fold(params, carry)

  def update_served(self, served, params, carry, decay, step):
    del served, decay, step
    return fold(params, carry)


def fold(params, carry):
  """`params` with the normalisation by `carry`'s running statistics
  folded into the head: W' = W / s, b' = b - (mean / s) W, where s =
  sqrt(var + eps). The encoder's arrays are the params' own."""
  head = params["head"]
  kernel, bias = nn.meta.unbox(head["kernel"]), nn.meta.unbox(head["bias"])
  scale = jax.lax.rsqrt(carry["var"] + EPSILON)
  folded = {
      "kernel": (kernel * scale[:, None]).astype(kernel.dtype),
      "bias": (bias - (carry["mean"] * scale) @ kernel).astype(bias.dtype)}
  return {**params, "head": {
      name: (head[name].replace_boxed(value)
             if isinstance(head[name], nn.meta.AxisMetadata) else value)
      for name, value in folded.items()}}
