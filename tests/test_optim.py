"""Schedules and optimizers of Tables 3 and 4."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from vit_jax import errors
from vit_jax.training import optimizer as optimizer_lib


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_warmup_then_decay_to_zero(decay):
  schedule = optimizer_lib.learning_rate_schedule(1e-3, total_steps=100,
                                          warmup_steps=10, decay=decay)
  np.testing.assert_allclose(schedule(0), 0.0)
  np.testing.assert_allclose(schedule(5), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(schedule(10), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(schedule(100), 0.0, atol=1e-12)
  middle = {"linear": 5e-4, "cosine": 5e-4}[decay]  # Both halve at midway.
  np.testing.assert_allclose(schedule(55), middle, rtol=1e-5)
  if decay == "cosine":  # Cosine stays above linear early on.
    assert schedule(30) > 1e-3 * (1 - 20 / 90)


def config(**overrides):
  values = dict(name="adam", learning_rate=1.0, warmup_steps=0,
                decay="linear", weight_decay=0.0, grad_clip_norm=0.0,
                b1=0.9, b2=0.999, momentum=0.9)
  values.update(overrides)
  return ml_collections.ConfigDict(values)


def one_update(opt, grads, params):
  tx, _ = optimizer_lib.create(opt, total_steps=10)
  updates, _ = tx.update(grads, tx.init(params), params)
  return updates


def test_weight_decay_is_decoupled_and_only_on_kernels():
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)}}
  zero_grads = optax.tree.zeros_like(params)
  updates = one_update(config(weight_decay=0.1), zero_grads, params)
  # lr(0) = 1 with no warm-up: the kernel shrinks by lr * wd * param.
  np.testing.assert_allclose(updates["dense"]["kernel"], -0.1)
  np.testing.assert_allclose(updates["dense"]["bias"], 0.0)


def test_clipping_bounds_the_global_norm():
  params = {"w": jnp.zeros(4)}
  grads = {"w": jnp.full(4, 10.0)}
  updates = one_update(config(name="sgd", grad_clip_norm=1.0), grads, params)
  np.testing.assert_allclose(np.linalg.norm(updates["w"]), 1.0, rtol=1e-6)


def test_bad_optimizer_settings_are_named():
  with pytest.raises(errors.InputError, match="optimizer.name"):
    optimizer_lib.create(config(name="lamb"), 10)
  with pytest.raises(errors.InputError,
                     match="weight_decay must be 0 with sgd"):
    optimizer_lib.create(config(name="sgd", weight_decay=0.1), 10)
  with pytest.raises(errors.InputError, match="optimizer.decay"):
    optimizer_lib.create(config(decay="step"), 10)
  with pytest.raises(errors.InputError, match="warmup_steps"):
    optimizer_lib.create(config(warmup_steps=10), 10)
