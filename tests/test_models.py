"""The model: sizes of Table 1, shapes of the release, behaviour users rely on."""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.util import randomize
from vit_jax import errors, models
from vit_jax.weights import npz


def abstract_params(model, image_size):
  images = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  variables = jax.eval_shape(
      lambda rng: model.init(rng, jnp.zeros(images.shape), train=False),
      jax.random.key(0))
  return variables["params"]


def count(params):
  return sum(np.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(params)))


@pytest.mark.parametrize("name,millions", [
    ("Ti/16", 5.7), ("S/16", 22), ("B/16", 86), ("L/16", 307), ("H/14", 632)])
def test_parameter_counts_match_table_1(name, millions):
  params = abstract_params(models.create(name, num_classes=1000), 224)
  assert count(params) == pytest.approx(millions * 1e6, rel=0.02)


def test_release_shapes_of_b16():
  params = nn.meta.unbox(abstract_params(models.create("B/16", 1000), 224))
  block = params["Transformer"]["encoderblock_11"]
  attention = block["MultiHeadDotProductAttention_1"]
  assert attention["query"]["kernel"].shape == (768, 12, 64)
  assert attention["out"]["kernel"].shape == (12, 64, 768)
  assert block["MlpBlock_3"]["Dense_0"]["kernel"].shape == (768, 3072)
  assert params["embedding"]["kernel"].shape == (16, 16, 3, 768)
  assert params["cls"].shape == (1, 1, 768)
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (
      1, 197, 768)
  assert "encoderblock_12" not in params["Transformer"]


def test_every_parameter_has_logical_axis_names():
  params = abstract_params(
      models.create("Ti/16", 10, representation_size=192), 32)
  leaves = jax.tree.leaves(
      params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert leaves
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned)
    assert len(leaf.names) == leaf.value.ndim


def tiny(**overrides):
  fields = dict(num_layers=2, hidden_size=32, mlp_dim=64, num_heads=4)
  fields.update(overrides)
  return models.create("Ti/4", num_classes=5, **fields)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_drop_path_skips_whole_branches_of_a_row_in_training_only(
    scan_layers):
  """Stochastic depth at timm's linear rates: of 2 blocks the first never
  drops, the second at drop_path_rate. At 0.999 nearly every row skips
  block 1's branches: its output is then block 1 made the identity's."""
  model = tiny(drop_path_rate=0.999, scan_layers=scan_layers)
  plain = tiny(scan_layers=scan_layers)
  images = jax.random.uniform(jax.random.key(1), (64, 16, 16, 3),
                              minval=-1, maxval=1)
  params = plain.init(jax.random.key(0), images[:1], train=False)["params"]
  params = jax.tree.map(lambda p: p + 0.1, nn.meta.unbox(params))
  np.testing.assert_array_equal(  # Evaluation drops nothing.
      model.apply({"params": params}, images, train=False),
      plain.apply({"params": params}, images, train=False))

  def identity_block_1(path, p):
    name = "/".join(str(k.key) for k in path)
    branch_out = ("MultiHeadDotProductAttention_1/out" in name
                  or "MlpBlock_3/Dense_1" in name)
    if not branch_out:
      return p
    if scan_layers:
      return p.at[1].set(0)
    return jnp.zeros_like(p) if "encoderblock_1/" in name else p

  skipped = plain.apply({"params": jax.tree_util.tree_map_with_path(
      identity_block_1, params)}, images, train=False)
  trained = model.apply({"params": params}, images, train=True,
                        rngs={"dropout": jax.random.key(2)})
  same = np.all(np.isclose(trained, skipped, rtol=1e-5, atol=1e-6), axis=1)
  assert same.sum() >= 60, same.sum()


def test_fresh_head_predicts_uniformly_and_any_divisible_resolution_works():
  model = tiny()
  variables = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)),
                         train=False)
  for size in (16, 24):  # More patches at 24: same params but posemb.
    images = jax.random.uniform(jax.random.key(1), (2, size, size, 3),
                                minval=-1, maxval=1)
    if size == 16:
      logits = model.apply(variables, images, train=False)
      assert logits.shape == (2, 5) and logits.dtype == jnp.float32
      np.testing.assert_array_equal(logits, 0.0)
    else:
      other = model.init(jax.random.key(0), images, train=False)
      posemb = other["params"]["Transformer"]["posembed_input"]["pos_embedding"]
      assert posemb.value.shape == (1, 1 + 36, 32)


def test_patch_size_must_divide_image():
  with pytest.raises(errors.InputError, match="patch size 4 does not divide"):
    tiny().init(jax.random.key(0), jnp.zeros((1, 18, 18, 3)), train=False)


def test_gap_classifier_has_no_class_token():
  variables = tiny(classifier="gap").init(
      jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)
  params = nn.meta.unbox(variables["params"])
  assert "cls" not in params
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (
      1, 16, 32)


def test_dropout_only_in_training():
  model = tiny(dropout_rate=0.5, attention_dropout_rate=0.5)
  images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3))
  variables = model.init(jax.random.key(0), images, train=False)
  variables = randomize(nn.meta.unbox(variables))
  eval_a = model.apply(variables, images, train=False)
  eval_b = model.apply(variables, images, train=False)
  train_a = model.apply(variables, images, train=True,
                        rngs={"dropout": jax.random.key(2)})
  train_b = model.apply(variables, images, train=True,
                        rngs={"dropout": jax.random.key(3)})
  np.testing.assert_array_equal(eval_a, eval_b)
  assert not np.allclose(train_a, train_b)
  assert not np.allclose(train_a, eval_a)


def test_bfloat16_compute_keeps_float32_params_and_close_logits():
  images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3), minval=-1)
  f32, bf16 = tiny(), tiny(dtype=jnp.bfloat16)
  variables = f32.init(jax.random.key(0), images, train=False)
  variables = randomize(nn.meta.unbox(variables), scale=0.05)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(
      bf16.init(jax.random.key(0), images, train=False)))
  expected = f32.apply(variables, images, train=False)
  got = bf16.apply(variables, images, train=False)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, expected, rtol=0.05, atol=0.05)


def test_unknown_names_are_refused_clearly():
  with pytest.raises(errors.InputError, match="unknown model 'X/16'"):
    models.create("X/16", num_classes=10)
  with pytest.raises(errors.InputError, match="unknown model 'B'"):
    models.create("B", num_classes=10)
  with pytest.raises(errors.InputError, match="classifer"):
    models.create("B/16", num_classes=10, classifer="gap")
  with pytest.raises(errors.InputError, match="classifier must be"):
    tiny(classifier="max").init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)),
                                train=False)


@pytest.mark.parametrize("remat_policy", ["", "nothing_saveable",
                                          "dots_with_no_batch_dims_saveable"])
@pytest.mark.parametrize("scan_layers", [False, True])
def test_remat_and_scan_leave_logits_and_gradients_equal(remat_policy,
                                                         scan_layers):
  """The same params (stacked for the scan) give the same logits and
  gradients, and attention weights for every layer."""
  images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3), minval=-1)
  labels = jnp.array([1, 3])
  plain = tiny(num_layers=3, representation_size=16)
  params = randomize(nn.meta.unbox(
      plain.init(jax.random.key(0), images, train=False)["params"]))
  model = tiny(num_layers=3, representation_size=16,
               remat_policy=remat_policy, scan_layers=scan_layers)
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  if scan_layers:
    flat = npz.scan_blocks(flat)
  theirs = flax.traverse_util.unflatten_dict(flat, sep="/")
  own = nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), images, train=False)["params"]))
  assert jax.tree.structure(own) == jax.tree.structure(theirs)

  def loss_and_grads(model, params):
    def loss(params):
      logits, state = model.apply(
          {"params": params}, images, train=True, mutable="intermediates",
          rngs={"dropout": jax.random.key(2)})
      loss = -jnp.take_along_axis(jax.nn.log_softmax(logits),
                                  labels[:, None], axis=1).mean()
      return loss, (logits, state["intermediates"])
    # With XLA:CPU's default emitters, as users run, whatever the tests'
    # XLA_FLAGS: the older ones that tests/conftest.py picks round a few of
    # these gradients differently (by up to 2e-7) with remat or scan.
    grads = jax.jit(jax.grad(loss, has_aux=True)).lower(params).compile(
        compiler_options={"xla_cpu_use_fusion_emitters": True})
    return grads(params)

  expected_grads, (expected_logits, expected_sown) = loss_and_grads(
      plain, params)
  grads, (logits, sown) = loss_and_grads(model, theirs)
  np.testing.assert_array_equal(logits, expected_logits)
  grads = flax.traverse_util.flatten_dict(grads, sep="/")
  if scan_layers:
    grads = npz.unscan_blocks(grads)
  for key, expected in flax.traverse_util.flatten_dict(
      expected_grads, sep="/").items():
    np.testing.assert_allclose(grads[key], expected, rtol=1e-5, atol=1e-7,
                               err_msg=key)
  weights = sown["Transformer"]
  if scan_layers:  # One stacked entry, layer first.
    (stacked,) = weights["encoderblock"]["MultiHeadDotProductAttention_1"][
        "attention_weights"]
    per_layer = list(stacked)
  else:
    per_layer = [weights[f"encoderblock_{i}"]["MultiHeadDotProductAttention_1"]
                 ["attention_weights"][0] for i in range(3)]
  for i, layer in enumerate(per_layer):
    np.testing.assert_array_equal(
        layer, expected_sown["Transformer"][f"encoderblock_{i}"]
        ["MultiHeadDotProductAttention_1"]["attention_weights"][0])


def test_unknown_remat_policy_is_refused():
  with pytest.raises(errors.InputError, match="remat_policy must be one of "
                     r"\[.*'nothing_saveable'.*\], got 'dots'"):
    models.create("B/16", num_classes=10, remat_policy="dots")


@pytest.mark.parametrize("overrides", [
    dict(classifier="token", representation_size=None),
    dict(classifier="gap", representation_size=24),
    dict(classifier="map", num_registers=4, layer_scale=1.0, qk_norm=True),
])
def test_the_architecture_is_read_back_from_the_params(overrides):
  model = models.create("Ti/4", num_classes=7, hidden_size=48, num_layers=3,
                        mlp_dim=96, num_heads=6, **overrides)
  params = model.init(jax.random.key(0), jnp.zeros((1, 20, 20, 3)),
                      train=False)["params"]
  read, image_size = models.from_params(nn.meta.unbox(params))
  assert image_size == 20
  assert read == model


@pytest.mark.parametrize("attention, overrides", [
    ("fused", {}), ("fused", {"classifier": "map"}),
    ("fused", {"qk_norm": True, "num_registers": 2}),
    # The pooling head's attention is the einsum's whatever the blocks'.
    ("splash", {}), ("splash", {"qk_norm": True, "num_registers": 2})])
def test_fused_attention_computes_the_einsum_function(attention, overrides):
  """Same params, same logits and gradients: a run may switch between them
  (on a GPU, "fused" is cuDNN's kernel, here XLA's; "splash", a TPU
  kernel, is interpreted here)."""
  images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3), minval=-1)
  einsum = tiny(num_layers=2, **overrides)
  fused = tiny(num_layers=2, attention=attention, **overrides)
  params = randomize(nn.meta.unbox(
      einsum.init(jax.random.key(0), images, train=False)["params"]))

  def logits_and_grads(model):
    def total(params):
      logits = model.apply({"params": params}, images, train=True)
      return jnp.sum(logits ** 2), logits
    return jax.jit(jax.grad(total, has_aux=True))(params)

  expected_grads, expected = logits_and_grads(einsum)
  grads, logits = logits_and_grads(fused)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
  # The splash kernel sums its softmax a tile at a time (online): gradients
  # as large as 30 differ by float32 rounding's 2e-5 in places.
  atol = 1e-4 if attention == "splash" else 1e-5
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=atol),
               grads, expected_grads)


def test_fused_attention_refuses_attention_dropout():
  for attention in ("fused", "splash"):
    with pytest.raises(errors.InputError, match="attention_dropout_rate"):
      models.create("B/16", num_classes=10, attention=attention,
                    attention_dropout_rate=0.1)
  with pytest.raises(errors.InputError, match="attention must be one of"):
    models.create("B/16", num_classes=10, attention="flash")
