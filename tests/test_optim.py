"""Schedules and optimizers of Tables 3 and 4."""

import re

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax import errors
from vit_jax.runs import settings
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
  return settings.Optimizer(**values)


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


def test_a_bfloat16_first_moment_halves_its_bytes_and_nothing_else():
  params = {"w": jnp.linspace(-1.0, 1.0, 64).reshape(8, 8)}
  grads = [{"w": jnp.sin(params["w"] * k)} for k in (1.0, 2.0, 3.0)]

  def run(tx):
    state, updates = tx.init(params), []
    for g in grads:
      update, state = tx.update(g, state, params)
      updates.append(update["w"])
    return state, updates

  # The default is optax's Adam as the step has always run it, bitwise.
  _, schedule = optimizer_lib.create(config(), total_steps=10)
  default_state, default = run(optimizer_lib.create(config(), 10)[0])
  _, today = run(optax.chain(optax.scale_by_adam(b1=0.9, b2=0.999),
                             optax.scale_by_learning_rate(schedule)))
  for got, expected in zip(default, today):
    np.testing.assert_array_equal(got, expected)
  state, halved = run(optimizer_lib.create(config(mu_dtype="bfloat16"), 10)[0])
  adam, default_adam = state[0], default_state[0]
  assert adam.mu["w"].dtype == jnp.bfloat16
  assert adam.mu["w"].nbytes * 2 == default_adam.mu["w"].nbytes
  assert adam.nu["w"].dtype == default_adam.nu["w"].dtype == jnp.float32
  # The updates move by bfloat16's rounding of the moment, no more.
  for got, expected in zip(halved, default):
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=1e-3)
  with pytest.raises(errors.InputError,
                     match="mu_dtype must be one of float32, bfloat16"):
    optimizer_lib.create(config(mu_dtype="float16"), 10)


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


def small_model_params(num_layers, scan_layers):
  """Abstract params of a tiny ViT: their names and shapes."""
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax import models  # pylint: disable=g-import-not-at-top
  model = models.create("Ti/2", 3, hidden_size=8, num_layers=num_layers,
                        mlp_dim=16, num_heads=2, scan_layers=scan_layers)
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.meta.unbox(jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, 4, 4, 3)), train=False)["params"]))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_layer_decay_scales_block_i_of_l_by_decay_to_the_l_minus_i(
    scan_layers):
  import jax  # pylint: disable=g-import-not-at-top
  depth, decay = 4, 0.5
  params = small_model_params(depth, scan_layers)
  ones = jax.tree.map(lambda p: jnp.ones(p.shape), params)
  # SGD without momentum: the update is -lr x multiplier x gradient.
  tx, _ = optimizer_lib.create(config(name="sgd", momentum=0.0,
                                      layer_decay=decay), 10, depth)
  updates, _ = tx.update(ones, tx.init(ones), ones)
  seen = set()
  for path, update in jax.tree_util.tree_leaves_with_path(updates):
    name = optimizer_lib.parameter_name(path)
    update = -np.asarray(update)
    if name.startswith("Transformer/encoderblock_"):
      i = int(name.split("/")[1].split("_")[1])
      want = decay ** (depth - i)
    elif name.startswith("Transformer/encoderblock/"):  # Stacked: axis 0.
      want = (decay ** (depth - np.arange(depth))).reshape(
          (-1,) + (1,) * (update.ndim - 1))
    elif name.startswith(("head", "Transformer/encoder_norm")):
      want = 1.0
    else:
      assert name.startswith(("embedding", "cls", "Transformer/posembed"))
      want = decay ** (depth + 1)
    np.testing.assert_allclose(update, np.broadcast_to(want, update.shape),
                               rtol=1e-6, err_msg=name)
    seen.add(name.split("/")[0] if "encoderblock" not in name else "block")
  assert seen == {"embedding", "cls", "Transformer", "block", "head"}


def test_lr_mults_multiply_the_first_matching_parameters_rate():
  import jax  # pylint: disable=g-import-not-at-top
  params = small_model_params(2, False)
  ones = jax.tree.map(lambda p: jnp.ones(p.shape), params)
  opt = config(name="sgd", momentum=0.0, layer_decay=0.5,
               lr_mults=((r"head/.*", 10.0), (r".*", 0.1)))
  tx, _ = optimizer_lib.create(opt, 10, 2)
  updates, _ = tx.update(ones, tx.init(ones), ones)
  np.testing.assert_allclose(-updates["head"]["kernel"], 10.0)
  np.testing.assert_allclose(
      -updates["Transformer"]["encoderblock_0"]["LayerNorm_0"]["scale"],
      0.5 ** 2 * 0.1)


def test_frozen_parameters_are_bitwise_unchanged_and_hold_no_state(
    digits_data_dir):
  import jax  # pylint: disable=g-import-not-at-top

  from tests.util import (
    program_of,
    small_config,
    train_steps,  # pylint: disable=g-import-not-at-top,
  )
  frozen = r"embedding/.*|cls|Transformer/posembed_input/.*|Transformer/encoderblock_0/.*"
  states = {}
  for name, pattern in (("frozen", frozen), ("trained", "")):
    cfg = small_config(digits_data_dir, **{"optimizer.frozen": pattern})
    program = program_of(cfg)
    state = program.init(jax.random.key(0))
    before = jax.device_get(state.params)
    _, state = train_steps(program, state, cfg, 3)
    states[name] = (before, jax.device_get(state.params),
                    jax.tree.leaves(state.opt_state))
  before, after, opt_leaves = states["frozen"]
  moved = []
  for (path, old), new in zip(jax.tree_util.tree_leaves_with_path(before),
                              jax.tree.leaves(after)):
    name = optimizer_lib.parameter_name(path)
    if re.fullmatch(frozen, name):
      np.testing.assert_array_equal(new, old, err_msg=name)
    elif not np.array_equal(new, old):
      moved.append(name)
  assert "head/kernel" in moved
  assert "Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel" in moved
  # Adam's two moments of each trained parameter, none of a frozen one.
  size = lambda leaves: sum(np.size(leaf) for leaf in leaves)
  frozen_size = size(leaf for path, leaf in
                     jax.tree_util.tree_leaves_with_path(before)
                     if re.fullmatch(frozen, optimizer_lib.parameter_name(path)))
  assert size(states["trained"][2]) - size(opt_leaves) == 2 * frozen_size


@pytest.mark.parametrize("setting, message", [
    (dict(layer_decay=0.0), "layer_decay must be in"),
    (dict(layer_decay=1.5), "layer_decay must be in"),
    (dict(lr_mults=(("head", -1.0),)), "lr_mults must be pairs"),
    (dict(lr_mults=("head",)), "lr_mults must be pairs"),
    (dict(frozen="head/[k"), "is not a regular expression"),
])
def test_bad_per_parameter_settings_are_named(setting, message):
  with pytest.raises(errors.InputError, match=message):
    optimizer_lib.create(config(**setting), 10, 2)
