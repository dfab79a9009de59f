"""model.fp8: the encoder blocks' dense matmuls in float8 (models/fp8.py).

On this CPU the float8 rounding runs but the matmuls do not get faster;
what is checked here is the arithmetic a GPU's float8 GEMM does, and that
the model trains with it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from vit_jax import models
from vit_jax.models import fp8

DENSE = (((1,), (0,)), ((), ()))


def rounded(x, dtype):
  """Reference rounding in numpy: x over its absolute maximum, mapped to
  dtype's largest value, rounded to dtype and scaled back."""
  x = np.asarray(x, np.float32)
  scale = np.abs(x).max() / float(ml_dtypes.finfo(dtype).max)
  return (x / scale).astype(dtype).astype(np.float32) * scale


def test_the_product_is_of_e4m3_operands_and_its_gradients_of_e5m2_ones():
  x = jax.random.normal(jax.random.key(0), (32, 48)) * 3.0
  w = jax.random.normal(jax.random.key(1), (48, 16)) * 0.02
  g = jax.random.normal(jax.random.key(2), (32, 16)) * 1e-3
  out, pullback = jax.vjp(lambda x, w: fp8.dot_general(x, w, DENSE), x, w)
  dx, dw = pullback(g)

  x8, w8 = rounded(x, ml_dtypes.float8_e4m3fn), rounded(w, ml_dtypes.float8_e4m3fn)
  g8 = rounded(g, ml_dtypes.float8_e5m2)
  for got, want in ((out, x8 @ w8), (dx, g8 @ w8.T), (dw, x8.T @ g8)):
    np.testing.assert_allclose(got, want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
  # Rounding happened, each tensor under its own scale, small as g is.
  exact = np.asarray(x) @ np.asarray(w)
  error = np.linalg.norm(out - exact) / np.linalg.norm(exact)
  assert 1e-3 < error < 0.1
  exact_dw = np.asarray(x).T @ np.asarray(g)
  assert np.linalg.norm(dw - exact_dw) / np.linalg.norm(exact_dw) < 0.2


def test_the_gradients_ask_for_full_accumulation():
  """On Hopper, DEFAULT lets cuBLASLt accumulate float8 products in its
  narrower accumulator; the gradients' sums over a whole batch ask not to."""
  x, w = jnp.ones((32, 48), jnp.bfloat16), jnp.ones((48, 16), jnp.bfloat16)
  jaxpr = jax.make_jaxpr(jax.grad(
      lambda x, w: fp8.dot_general(x, w, DENSE).astype(jnp.float32).sum(),
      (0, 1)))(x, w)
  products = []

  def find(jaxpr):
    for equation in jaxpr.eqns:
      if equation.primitive.name == "dot_general":
        products.append(equation.params["precision"])
      for value in equation.params.values():
        if isinstance(value, jax.extend.core.ClosedJaxpr):
          find(value.jaxpr)
  find(jaxpr.jaxpr)
  default, highest = jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST
  # The forward product, then the two gradients'.
  assert products == [(default, default), (highest, highest),
                      (highest, highest)]


def test_only_a_dense_layers_product_is_taken():
  with pytest.raises(ValueError, match="dense layer"):
    fp8.dot_general(jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5)),
                    (((2,), (1,)), ((0,), (0,))))


def test_an_all_zero_operand_gives_zeros_not_nan():
  out = fp8.dot_general(jnp.zeros((4, 8)), jnp.ones((8, 2)), DENSE)
  np.testing.assert_array_equal(out, np.zeros((4, 2)))


def tiny(**overrides):
  return models.create("Ti/4", num_classes=5, num_layers=2, hidden_size=32,
                       mlp_dim=64, num_heads=4, **overrides)


def float8_roundings(model, params, images):
  """How many tensors the model's forward rounds to e4m3, found in its
  jaxpr and every jaxpr nested in it (a scan's body counted once)."""
  def count(jaxpr):
    found = 0
    for equation in jaxpr.eqns:
      if (equation.primitive.name == "convert_element_type"
          and equation.params["new_dtype"] == jnp.float8_e4m3fn):
        found += 1
      for value in equation.params.values():
        for inner in value if isinstance(value, (tuple, list)) else [value]:
          if isinstance(inner, jax.extend.core.ClosedJaxpr):
            found += count(inner.jaxpr)
          elif isinstance(inner, jax.extend.core.Jaxpr):
            found += count(inner)
    return found
  return count(jax.make_jaxpr(lambda p: model.apply(
      {"params": p}, images, train=False))(params).jaxpr)


@pytest.mark.parametrize("overrides", [
    dict(), dict(classifier="map"), dict(scan_layers=True, num_registers=1),
    dict(remat_policy="nothing_saveable", attention="fused")])
def test_only_the_blocks_dense_layers_round_and_the_params_are_the_same(
    overrides):
  images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3), minval=-1)
  plain, quantized = tiny(**overrides), tiny(fp8=True, **overrides)
  params = nn.meta.unbox(plain.init(jax.random.key(0), images,
                                    train=False)["params"])
  # A head that is not all zeros, so that the logits show the blocks' work.
  params["head"]["kernel"] = jax.random.normal(
      jax.random.key(3), params["head"]["kernel"].shape)
  same = nn.meta.unbox(quantized.init(jax.random.key(0), images,
                                      train=False)["params"])
  assert jax.tree.map(np.shape, same) == jax.tree.map(np.shape, params)
  same["head"]["kernel"] = params["head"]["kernel"]
  jax.tree.map(np.testing.assert_array_equal, same, params)

  # q, k, v, out and the MLP's two: six products of two operands a block,
  # counted in the jaxpr that also holds the embedding and the heads.
  assert float8_roundings(plain, params, images) == 0
  per_block = 6 * 2
  blocks = 1 if overrides.get("scan_layers") else 2  # A scan traces one.
  assert float8_roundings(quantized, params, images) == blocks * per_block

  logits = plain.apply({"params": params}, images, train=False)
  rounded_logits = quantized.apply({"params": params}, images, train=False)
  assert not np.array_equal(logits, rounded_logits)
  # e4m3 keeps 3 mantissa bits (each operand within about 3%), twelve
  # roundings a block.
  assert (np.linalg.norm(rounded_logits - logits) / np.linalg.norm(logits)
          < 0.2)


def test_a_float8_model_trains_as_far_as_a_bfloat16_one():
  """Twenty Adam steps on one batch from one init: the loss falls as far
  with float8 matmuls (within a tenth) as without."""
  images = jax.random.uniform(jax.random.key(1), (16, 16, 16, 3), minval=-1)
  labels = jax.random.randint(jax.random.key(2), (16,), 0, 5)
  losses = {}
  for quantized in (False, True):
    model = tiny(fp8=quantized, dtype="bfloat16")
    params = nn.meta.unbox(model.init(jax.random.key(0), images,
                                      train=False)["params"])
    optimizer = optax.adam(3e-3)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, model=model, optimizer=optimizer):
      def loss(params):
        logits = model.apply({"params": params}, images, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), labels).mean()
      value, grads = jax.value_and_grad(loss)(params)
      updates, state = optimizer.update(grads, state, params)
      return optax.apply_updates(params, updates), state, value

    for _ in range(20):
      params, state, value = step(params, state)
    losses[quantized] = float(value)
  start = float(np.log(5))
  assert losses[False] < 0.5 * start
  assert losses[True] < 0.5 * start
  assert abs(losses[True] - losses[False]) < 0.1 * start
