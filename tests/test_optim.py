"""Schedules and optimizers of Tables 3 and 4."""

import dataclasses
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


# Muon (training/muon.py) and warmup-stable-decay.

MLP_KERNEL = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"


def nested(flat):
  """{"a/b": x} -> {"a": {"b": x}}."""
  import flax  # pylint: disable=g-import-not-at-top
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def muon_updates(opt, grads, params, steps=3):
  """The updates of `steps` steps of create(opt) on the same `grads`."""
  tx, _ = optimizer_lib.create(opt, total_steps=10)
  state, updates = tx.init(params), []
  for _ in range(steps):
    update, state = tx.update(grads, state, params)
    updates.append(update)
  return updates


@pytest.mark.parametrize("rms", [0.2, 0.0])
def test_muon_on_a_matrix_is_optax_contrib_muon(rms):
  """A block's MLP kernel: our update, step after step, is optax.contrib.
  muon's (Nesterov momentum 0.95, Newton-Schulz, its shape scaling, decay
  of the kernel) at either scaling."""
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(16, 24)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(16, 24)), jnp.float32)
  ours = muon_updates(config(name="muon", learning_rate=0.1,
                             weight_decay=0.01, muon_consistent_rms=rms),
                      nested({MLP_KERNEL: g}), nested({MLP_KERNEL: w}))
  schedule = optimizer_lib.learning_rate_schedule(0.1, 10, 0, "linear")
  tx = optax.contrib.muon(schedule, weight_decay=0.01,
                          consistent_rms=rms or None)
  state = tx.init({"w": w})
  for update in ours:
    theirs, state = tx.update({"w": g}, state, {"w": w})
    np.testing.assert_allclose(update["Transformer"]["encoderblock_0"][
        "MlpBlock_3"]["Dense_0"]["kernel"], theirs["w"], rtol=1e-6,
                               atol=1e-7)


def orthogonalised(x, dims):
  from optax.contrib import _muon  # pylint: disable=g-import-not-at-top
  return _muon.orthogonalize_via_newton_schulz(
      x, jnp.asarray(_muon._DEFAULT_NS_COEFFS), dimension_numbers=dims)


@pytest.mark.parametrize("scanned", [False, True])
def test_muon_orthogonalises_each_attention_projection_on_its_own(scanned):
  """query, key and value [width, heads, head_dim] are three matrices of
  width x (heads * head_dim), each orthogonalised alone (per head with
  muon_per_head); not one fused qkv matrix. A scanned stack's leading
  layer axis is a batch: each layer's matrix alone. Embeddings, norms,
  biases and the head go to AdamW."""
  from optax.contrib import MuonDimensionNumbers  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  block = "Transformer/encoderblock/" if scanned else (
      "Transformer/encoderblock_0/")
  lead = (2,) if scanned else ()
  shape = (*lead, 16, 4, 8)
  names = [f"{block}MultiHeadDotProductAttention_1/{p}/kernel"
           for p in ("query", "key", "value")]
  grads = {name: jnp.asarray(rng.normal(size=shape), jnp.float32)
           for name in names}
  grads.update({"head/kernel": jnp.ones((32, 10)),
                "embedding/kernel": jnp.ones((2, 2, 3, 32)),
                f"{block}LayerNorm_0/scale": jnp.ones((*lead, 16))})
  params = {name: jnp.zeros_like(g) for name, g in grads.items()}
  opt = config(name="muon", learning_rate=1.0, muon_consistent_rms=0.0)
  for per_head in (False, True):
    (update,) = muon_updates(dataclasses.replace(opt, muon_per_head=per_head),
                             nested(grads), nested(params), steps=1)
    flat = flatten(update)
    axis = len(lead)
    dims = MuonDimensionNumbers(
        reduction_axis=axis,
        output_axis=axis + 2 if per_head else (axis + 1, axis + 2))
    # Nesterov's first step: (beta * mu + (1 - beta) g) bias-corrected is g.
    joint = orthogonalised(jnp.concatenate([grads[n] for n in names],
                                           axis=-2), dims)
    scale = np.sqrt(max(1, 8 / 16) if per_head else max(1, 32 / 16))
    for i, name in enumerate(names):
      expected = -orthogonalised(grads[name], dims) * scale
      np.testing.assert_allclose(flat[name], expected, rtol=2e-5, atol=2e-6)
      if not per_head:  # A fused qkv, one width x 3 width matrix: differs.
        one_of_three = -joint[..., 4 * i:4 * (i + 1), :] * scale
        assert np.abs(flat[name] - one_of_three).max() > 0.05
    if scanned:  # Each layer alone: not the stack as one matrix.
      stacked = -orthogonalised(grads[names[0]], MuonDimensionNumbers(
          reduction_axis=(0, 1), output_axis=(2, 3))) * scale
      assert np.abs(flat[names[0]] - stacked).max() > 0.05
  assert not muon_labels(params)["head/kernel"] == "muon"
  assert {muon_labels(params)[name] for name in grads} == {
      "muon" if name in names else "adam" for name in grads} == {"muon",
                                                                   "adam"}


def flatten(tree):
  import flax  # pylint: disable=g-import-not-at-top
  return flax.traverse_util.flatten_dict(tree, sep="/")


def muon_labels(flat_params):
  from vit_jax.training import muon  # pylint: disable=g-import-not-at-top
  return flatten(muon.labels(nested(flat_params),
                             optimizer_lib.parameter_name))


def test_muon_sends_every_matrix_of_the_blocks_and_nothing_else():
  """Of a MAP-headed ViT's params: the blocks' attention and MLP kernels to
  Muon; the patch embedding, position embedding, norms, biases, the MAP
  head and the classifier to AdamW."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top

  from vit_jax import models  # pylint: disable=g-import-not-at-top
  model = models.create("Ti/4", 10, hidden_size=32, num_layers=2,
                        num_heads=4, mlp_dim=64, classifier="map")
  params = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False))["params"]
  labels = muon_labels(flatten(nn.meta.unbox(params)))
  muon = sorted(name for name, label in labels.items() if label == "muon")
  assert muon == sorted(
      f"Transformer/encoderblock_{i}/{part}/kernel" for i in range(2)
      for part in ("MlpBlock_3/Dense_0", "MlpBlock_3/Dense_1",
                   *(f"MultiHeadDotProductAttention_1/{p}" for p in
                     ("query", "key", "value", "out"))))


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_wsd_holds_the_peak_then_decays_its_last_fraction(shape):
  schedule = optimizer_lib.learning_rate_schedule(
      1e-3, total_steps=100, warmup_steps=10, decay="wsd", wsd_fraction=0.2,
      wsd_shape=shape)
  np.testing.assert_allclose(schedule(5), 5e-4, rtol=1e-6)
  for step in (10, 50, 80):
    assert schedule(step) == np.float32(1e-3)  # Bitwise the peak.
  assert int(optimizer_lib.stable_end(100, 10, 0.2)) == 80
  middle = {"linear": 0.5, "1-sqrt": 1 - np.sqrt(0.5)}[shape]
  np.testing.assert_allclose(schedule(90), 1e-3 * middle, rtol=1e-5)
  np.testing.assert_allclose(schedule(100), 0.0, atol=1e-12)
  # A longer run: the same rate, bitwise, at every step before the decay.
  longer = optimizer_lib.learning_rate_schedule(
      1e-3, total_steps=1000, warmup_steps=10, decay="wsd",
      wsd_fraction=0.2, wsd_shape=shape)
  steps = jnp.arange(81)
  np.testing.assert_array_equal(schedule(steps), longer(steps))


@pytest.mark.parametrize("scan", [False, True])
def test_muon_trains_alike_on_one_device_and_on_fsdp_by_model(
    digits_data_dir, scan):
  """A step of Muon (per head) on the digits model: the params' change is
  the one device's, within 1e-6, on fsdp 4 x model 2 where every block
  matrix is split both ways (Newton-Schulz on sharded matrices). Without
  a key bias: its gradient is rounding noise (softmax ignores it), which
  Adam scales up to full steps that differ by sharding."""
  import jax  # pylint: disable=g-import-not-at-top

  from tests.util import program_of, small_config, train_steps  # pylint: disable=g-import-not-at-top
  from vit_jax import sharding  # pylint: disable=g-import-not-at-top
  cfg = small_config(digits_data_dir, **{
      "optimizer.name": "muon", "optimizer.muon_per_head": True,
      "optimizer.learning_rate": 0.02, "optimizer.warmup_steps": 0,
      "model.dropout_rate": 0.0, "model.scan_layers": scan,
      "model.key_bias": False,
      "mesh.data": 1, "mesh.fsdp": 4, "mesh.model": 2,
      "mesh.fsdp_min_bytes": 1})
  changes = []
  for mesh in (sharding.make_mesh({"data": 1, "fsdp": 1, "model": 1},
                                  jax.devices()[:1]), None):
    program = program_of(cfg, mesh=mesh)
    state = program.init(jax.random.key(0))
    before = jax.device_get(state.params)
    _, state = train_steps(program, state, cfg, 1)
    changes.append(jax.tree.map(lambda new, old: new - old,
                                jax.device_get(state.params), before))
    if mesh is None:  # The sharded run split a block's matrix both ways.
      spec = flatten(program.state_shardings.params)[
          ("Transformer/encoderblock" + ("" if scan else "_0"))
          + "/MultiHeadDotProductAttention_1/query/kernel"].spec
      assert "fsdp" in spec and "model" in spec
  moved = max(np.abs(x).max() for x in jax.tree.leaves(changes[0]))
  assert moved > 1e-3
  for (path, one), eight in zip(
      jax.tree_util.tree_leaves_with_path(changes[0]),
      jax.tree.leaves(changes[1])):
    np.testing.assert_allclose(eight, one, atol=1e-6,
                               err_msg=optimizer_lib.parameter_name(path))


def test_a_wsd_run_extended_before_its_decay_is_the_longer_run(
    digits_data_dir, tmp_path, monkeypatch):
  """A WSD run of 8 steps (decaying from step 4), stopped at step 3 and
  restarted with total_steps 12: bitwise the run configured with 12 from
  the start (params, optimizer state, each step's loss), through the same
  compiled step (the numbers are its data: the lowered programs are the
  same text). The checkpoint of the decay's first step is kept beside the
  newest, and `vit_jax.branch` starts a shorter decay from it."""
  import jax  # pylint: disable=g-import-not-at-top

  from tests.util import (  # pylint: disable=g-import-not-at-top
    call_tool,
    latest_state,
    logged,
    run_training,
    sigterm_at_step,
    small_config,
  )
  from vit_jax.planning import cost  # pylint: disable=g-import-not-at-top
  from vit_jax.runs.workdir import Workdir  # pylint: disable=g-import-not-at-top

  def wsd(total):
    return small_config(digits_data_dir, **{
        "optimizer.decay": "wsd", "optimizer.wsd_fraction": 0.5,
        "optimizer.warmup_steps": 1, "total_steps": total, "log_every": 1,
        "checkpoint_every": 100, "keep_checkpoints": 1,
        "evaluators.test.every": 0})
  extended, longer = str(tmp_path / "extended"), str(tmp_path / "longer")
  with monkeypatch.context() as patch:
    sigterm_at_step(patch, 3)
    assert run_training(wsd(8), extended)["stopped_at_step"] == 3
  run_training(wsd(12), extended)
  run_training(wsd(12), longer)
  assert logged(extended) == logged(longer) and len(logged(longer)) == 12
  (state, _), (expected, _) = (latest_state(workdir, wsd(12))
                                for workdir in (extended, longer))
  for one, other in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(one, other)
  assert Workdir(longer).checkpoint_steps() == [6, 12]
  # A shorter decay branched from the kept step: the same state there (its
  # loss at step 7 is of the params after step 6), then its own rate.
  branched = str(tmp_path / "branched")
  status, _, stderr = call_tool("branch", f"--workdir={longer}",
                                f"--to={branched}")
  assert status == 0, stderr[-2000:]
  short = wsd(8)
  short.optimizer.wsd_fraction = 0.25  # Decays over steps 7 and 8.
  run_training(short, branched)
  before, after = logged(longer), logged(branched)
  assert sorted(after) == list(range(1, 9))
  assert {s: after[s] for s in range(1, 8)} == {s: before[s]
                                                 for s in range(1, 8)}
  # Step 8's rate is the short decay's: half of its two steps decayed.
  peak = short.optimizer.learning_rate
  np.testing.assert_allclose(logged(branched, "learning_rate")[8],
                             peak * (1 - np.sqrt(0.5)), rtol=1e-5)
  np.testing.assert_allclose(logged(longer, "learning_rate")[8],
                             peak * (1 - np.sqrt(1 / 6)), rtol=1e-5)
  status, _, stderr = call_tool("branch", f"--workdir={longer}",
                                f"--to={branched}")
  assert status == 2 and "holds a run already" in stderr
  texts = []
  for total in (8, 12):
    program, batch = cost.build_step(settings.of(wsd(total)), jax.devices(),
                                     10)
    texts.append(program.train_step.lower(program.state_shapes,
                                          batch).as_text())
  assert texts[0] == texts[1]


def test_muon_takes_frozen_parts_layer_decay_and_a_bfloat16_momentum():
  """As with Adam: a frozen block gets no update and no state; layer decay
  scales Muon's and AdamW's updates alike; mu_dtype bfloat16 keeps Muon's
  momentum and Adam's first moment in half the bytes."""
  import jax  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  shapes = {"Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel": (8, 16),
            "Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel": (8, 16),
            "head/kernel": (8, 10)}
  grads = nested({name: jnp.asarray(rng.normal(size=shape), jnp.float32)
                  for name, shape in shapes.items()})
  params = jax.tree.map(jnp.zeros_like, grads)
  plain = config(name="muon", mu_dtype="bfloat16")
  (free,) = muon_updates(plain, grads, params, steps=1)
  opt = dataclasses.replace(plain, frozen="Transformer/encoderblock_0/.*",
                            layer_decay=0.5)
  tx, _ = optimizer_lib.create(opt, total_steps=10, num_layers=2)
  state = tx.init(params)
  update, _ = tx.update(grads, state, params)
  flat, expected = flatten(update), flatten(free)
  frozen, block_1, head = shapes
  assert not np.any(flat[frozen])
  # (Within float rounding: the masked tree is another program.)
  np.testing.assert_allclose(flat[block_1], 0.5 * expected[block_1],
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(flat[head], expected[head], rtol=1e-4,
                             atol=1e-6)
  held = [leaf for leaf in jax.tree.leaves(state) if np.ndim(leaf) == 2]
  # Muon's momentum of block 1 (bfloat16); Adam's two moments of the head.
  assert sorted((leaf.shape, str(leaf.dtype)) for leaf in held) == sorted([
      ((8, 16), "bfloat16"), ((8, 10), "bfloat16"), ((8, 10), "float32")])


def test_the_plan_counts_muons_newton_schulz_flops():
  """The compiled step's FLOPs, which vit_jax.plan reads (planning.cost.
  step_cost; here on the CPU, whose cost model has no time), with Muon
  exceed AdamW's by Newton-Schulz's: 5 iterations of 4 m^2 n + 2 m^3 on
  each of the blocks' m x n matrices (m <= n) in its products, and at
  most 15% more for their elementwise work (10% here)."""
  import jax  # pylint: disable=g-import-not-at-top

  from tests.util import small_config  # pylint: disable=g-import-not-at-top
  from vit_jax.planning import cost  # pylint: disable=g-import-not-at-top
  flops = {}
  for name in ("adam", "muon"):
    keys = settings.of(small_config("/nonexistent", **{
        "optimizer.name": name, "mesh.data": 1, "mesh.model": 1}))
    program, batch = cost.build_step(keys, jax.devices()[:1], 10)
    compiled = program.train_step.lower(program.state_shapes,
                                        batch).compile()
    flops[name] = compiled.cost_analysis()["flops"]
  width, mlp, layers = 32, 64, 2  # tests/util.py's SMALL model.
  iteration = lambda m, n: 4 * m * m * n + 2 * m ** 3
  expected = 5 * layers * (4 * iteration(width, width)
                           + 2 * iteration(width, mlp))
  assert expected <= flops["muon"] - flops["adam"] <= 1.15 * expected
