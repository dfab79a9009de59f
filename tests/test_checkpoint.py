"""Released-checkpoint interchange: layouts, logits, adapting to a new model."""

import errno
import re

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from tests import reference_vit
from tests.util import as_siglip_tower, randomize
from vit_jax import errors, models, paths
from vit_jax.weights import adaptation, npz as npz_lib, pretrained

TINY = dict(num_layers=3, hidden_size=32, mlp_dim=64, num_heads=4)


def init_params(model, image_size, seed=0):
  variables = model.init(jax.random.key(seed),
                         jnp.zeros((1, image_size, image_size, 3)), train=False)
  return nn.meta.unbox(variables["params"])


def images(n, size, seed=1):
  return np.random.default_rng(seed).uniform(-1, 1, (n, size, size, 3)).astype(
      np.float32)


def flat(tree):
  return flax.traverse_util.flatten_dict(tree, sep="/")


def assert_trees_equal(a, b):
  a, b = flat(a), flat(b)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# The successor layouts, written from docs/paper.md's description of them.
def big_vision_layout(release_flat):
  per_type = {
      "LayerNorm_0": "LayerNorm_0",
      "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
      "LayerNorm_2": "LayerNorm_1",
      "MlpBlock_3": "MlpBlock_0"
  }
  out = {}
  for key, value in release_flat.items():
    parts = key.split("/")
    if parts[1:2] and parts[1].startswith("encoderblock_"):
      parts[2] = per_type[parts[2]]
    out["/".join(parts)] = value
  out["pos_embedding"] = out.pop("Transformer/posembed_input/pos_embedding")
  return out


def scanned_layout(big_vision_flat):
  out, blocks = {}, {}
  for key, value in big_vision_flat.items():
    match = re.match(r"Transformer/encoderblock_(\d+)/(.*)", key)
    if match:
      blocks.setdefault(match.group(2), {})[int(match.group(1))] = value
    else:
      out[key] = value
  for rest, layers in blocks.items():
    out[f"Transformer/encoderblock/{rest}"] = np.stack(
        [layers[i] for i in range(len(layers))])
  return out


@pytest.fixture(scope="module")
def trained_tiny():
  model = models.create("Ti/4", num_classes=7, representation_size=24, **TINY)
  return model, randomize(init_params(model, 16))


def test_save_then_load_gives_identical_params_and_logits(tmp_path,
                                                          trained_tiny):
  model, params = trained_tiny
  path = tmp_path / "vit.npz"
  npz_lib.save_npz(params, path)
  with np.load(path) as npz:  # The release layout is the flattened tree.
    assert "Transformer/encoderblock_2/MlpBlock_3/Dense_1/kernel" in npz.files
    assert "Transformer/posembed_input/pos_embedding" in npz.files
  loaded = npz_lib.load_npz(path)
  assert_trees_equal(loaded, params)
  x = images(3, 16)
  np.testing.assert_array_equal(
      model.apply({"params": loaded}, x, train=False),
      model.apply({"params": params}, x, train=False))


@pytest.mark.parametrize("layout", ["release", "big_vision", "scanned"])
def test_each_released_layout_loads(tmp_path, trained_tiny, layout):
  _, params = trained_tiny
  files = {"release": flat(params)}
  files["big_vision"] = big_vision_layout(files["release"])
  files["scanned"] = scanned_layout(files["big_vision"])
  marker = {
      "release": "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel",
      "big_vision": "Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel",
      "scanned": "Transformer/encoderblock/MlpBlock_0/Dense_0/kernel"
  }
  assert marker[layout] in files[layout]
  path = tmp_path / f"{layout}.npz"
  np.savez(path, **files[layout])
  assert_trees_equal(npz_lib.load_npz(path), params)


def test_a_scanned_model_saves_and_loads_the_release_layout(tmp_path,
                                                           trained_tiny):
  model, params = trained_tiny
  scanned = models.create("Ti/4", num_classes=7, representation_size=24,
                          scan_layers=True, **TINY)
  shapes = jax.eval_shape(lambda: init_params(scanned, 16))
  stacked = adaptation.adapt(params, shapes)  # Released -> scanned.
  assert stacked["Transformer"]["encoderblock"]["MlpBlock_3"]["Dense_0"][
      "kernel"].shape == (3, 32, 64)
  assert "encoderblock_0" not in stacked["Transformer"]
  x = images(3, 16)
  logits = lambda m, p: jax.jit(lambda p: m.apply({"params": p}, x,
                                                  train=False))(p)
  np.testing.assert_array_equal(logits(scanned, stacked), logits(model, params))

  path = tmp_path / "scanned.npz"
  npz_lib.save_npz(stacked, path)
  with np.load(path) as npz:
    assert sorted(npz.files) == sorted(flat(params))
  assert_trees_equal(npz_lib.load_npz(path), params)
  # And back to an unscanned model from the scanned tree itself.
  assert_trees_equal(adaptation.adapt(stacked, params), params)


# As published: the original release partly under `opt/target/` next to its
# optimizer state, big_vision under `params/` next to its own and a step.
@pytest.mark.parametrize("prefix,layout", [("opt/target/", "release"),
                                           ("params/", "big_vision"),
                                           ("params/", "scanned")])
def test_each_published_prefix_loads(tmp_path, trained_tiny, prefix, layout):
  _, params = trained_tiny
  files = {"release": flat(params)}
  files["big_vision"] = big_vision_layout(files["release"])
  files["scanned"] = scanned_layout(files["big_vision"])
  stored = {prefix + k: v for k, v in files[layout].items()}
  kernel = files[layout]["head/kernel"]
  if prefix == "opt/target/":
    stored["opt/state/step"] = np.array(123)
    stored["opt/state/param_states/head/kernel/grad_ema"] = kernel
  else:
    stored["step"] = np.array(123)
    stored["opt/mu/head/kernel"] = kernel
  path = tmp_path / "published.npz"
  np.savez(path, **stored)
  assert_trees_equal(npz_lib.load_npz(path), params)


def test_params_under_two_prefixes_are_refused(tmp_path, trained_tiny):
  _, params = trained_tiny
  release = flat(params)
  path = tmp_path / "both.npz"
  np.savez(path, **{f"params/{k}": v for k, v in release.items()},
           **{f"opt/target/{k}": v for k, v in release.items()})
  with pytest.raises(errors.InputError, match="cannot tell which tree"):
    npz_lib.load_npz(path)
  np.savez(path, **{f"params/{k}": v for k, v in release.items()}, cls=0)
  with pytest.raises(errors.InputError, match="cannot tell which tree"):
    npz_lib.load_npz(path)


def bits(array):
  assert array.dtype == np.float32, array.dtype
  return np.asarray(array).view(np.uint32)


def test_bfloat16_arrays_load_as_float32_exactly(tmp_path, trained_tiny):
  _, params = trained_tiny
  stored = {f"params/{k}": np.asarray(v).astype(ml_dtypes.bfloat16).view("V2")
            for k, v in big_vision_layout(flat(params)).items()}
  path = tmp_path / "bf16.npz"
  np.savez(path, **stored)
  with np.load(path) as npz:  # What numpy makes of bfloat16.
    assert npz["params/head/kernel"].dtype.str == "|V2"
  loaded = flat(npz_lib.load_npz(path))
  expected = jax.tree.map(
      lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), flat(params))
  assert sorted(loaded) == sorted(expected)
  assert any((expected[k] != flat(params)[k]).any() for k in expected)
  for key in expected:
    np.testing.assert_array_equal(bits(loaded[key]), bits(expected[key]),
                                  err_msg=key)


@pytest.mark.parametrize("dtype", ["V4", [("a", "i1"), ("b", "i1")]])
def test_other_void_dtypes_fail_naming_the_key(tmp_path, trained_tiny, dtype):
  _, params = trained_tiny
  files = flat(params)
  files["head/bias"] = np.zeros(7, dtype)
  path = tmp_path / "void.npz"
  np.savez(path, **files)
  with pytest.raises(errors.InputError, match="'head/bias'"):
    npz_lib.load_npz(path)


def test_save_npz_takes_what_model_init_returns(tmp_path):
  model = models.create("Ti/16", num_classes=5, hidden_size=32, num_layers=2,
                        mlp_dim=64, num_heads=4)
  x = images(2, 32)
  boxed = model.init(jax.random.key(0), x, train=False)["params"]
  boxed = randomize(boxed, seed=4)  # Maps inside the boxes, keeps them.
  is_box = lambda v: isinstance(v, nn.LogicallyPartitioned)
  assert any(map(is_box, jax.tree.leaves(boxed, is_leaf=is_box)))
  unboxed = nn.meta.unbox(boxed)
  path = tmp_path / "init.npz"
  npz_lib.save_npz(boxed, path)
  with np.load(path, allow_pickle=False) as npz:
    assert all(npz[k].dtype == np.float32 for k in npz.files)
  loaded = npz_lib.load_npz(path)
  assert_trees_equal(loaded, unboxed)
  np.testing.assert_array_equal(
      model.apply({"params": loaded}, x, train=False),
      model.apply({"params": boxed}, x, train=False))

  # A FrozenDict of jax.Arrays sharded over all devices writes the same file.
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
  def shard(v):
    spec = ("d",) if v.shape[0] % len(jax.devices()) == 0 else ()
    return jax.device_put(v, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(*spec)))
  sharded = flax.core.freeze(jax.tree.map(shard, unboxed))
  assert any(len(v.sharding.device_set) > 1 for v in jax.tree.leaves(sharded))
  npz_lib.save_npz(sharded, tmp_path / "sharded.npz")
  assert_trees_equal(npz_lib.load_npz(tmp_path / "sharded.npz"), unboxed)


def test_unknown_layout_fails_listing_the_keys(tmp_path):
  path = tmp_path / "other.npz"
  np.savez(path, foo=np.zeros(2), **{"bar/baz": np.zeros(3)})
  with pytest.raises(errors.InputError,
                     match="not a ViT checkpoint of a known layout") as error:
    npz_lib.load_npz(path)
  assert "['bar/baz', 'foo']" in str(error.value)
  np.savez(path, **{f"k{i:02d}": np.zeros(1) for i in range(12)})
  with pytest.raises(errors.InputError, match="not a ViT checkpoint") as error:
    npz_lib.load_npz(path)
  assert f"{[f'k{i:02d}' for i in range(10)]} ..." in str(error.value)
  assert "k10" not in str(error.value)


@pytest.mark.parametrize("classifier,representation_size",
                         [("token", 24), ("token", None), ("gap", None)])
def test_logits_match_an_independent_float64_forward(tmp_path, classifier,
                                                     representation_size):
  model = models.create("Ti/4", num_classes=7, classifier=classifier,
                        representation_size=representation_size, **TINY)
  params = randomize(init_params(model, 16), seed=3)
  path = tmp_path / "vit.npz"
  npz_lib.save_npz(params, path)
  x = images(4, 16)
  with np.load(path) as npz:
    expected = reference_vit.forward(dict(npz), x, classifier)
  got = model.apply({"params": npz_lib.load_npz(path)}, x, train=False)
  assert np.abs(expected).max() > 1  # Logits that say something.
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_full_size_b16_logits_match_the_float64_forward(tmp_path):
  """The real B/16 at 224 with random weights: all 12 blocks, 197 tokens."""
  model = models.create("B/16", num_classes=21843, representation_size=768)
  shapes = jax.eval_shape(lambda: init_params(model, 224))
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda s: (rng.standard_normal(s.shape) * 0.02).astype(np.float32),
      shapes)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x + 1 if path[-1].key == "scale" else x, params)
  path = tmp_path / "b16.npz"
  npz_lib.save_npz(params, path)
  x = images(2, 224)
  with np.load(path) as npz:
    expected = reference_vit.forward(dict(npz), x)
  got = model.apply({"params": npz_lib.load_npz(path)}, x, train=False)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_pickled_files_are_refused(tmp_path):
  path = tmp_path / "evil.npz"
  np.savez(path, **{"head/kernel": np.array([{"a": 1}], dtype=object)})
  with pytest.raises(errors.InputError, match="pickle"):
    npz_lib.load_npz(path)


def test_posemb_224_to_384_keeps_class_token_and_interpolates_grid():
  at_224 = init_params(models.create("B/16", 10), 224)
  at_384 = jax.eval_shape(lambda: init_params(models.create("B/16", 10), 384))
  posemb = np.zeros((1, 197, 768), np.float32)
  posemb[0, 0] = np.arange(768)
  rows, cols = np.meshgrid(np.arange(14), np.arange(14), indexing="ij")
  posemb[0, 1:, 0] = rows.ravel()  # A linear ramp survives bilinear zoom.
  posemb[0, 1:, 1] = cols.ravel()
  at_224["Transformer"]["posembed_input"]["pos_embedding"] = posemb
  adapted = adaptation.adapt(at_224, at_384)
  resized = adapted["Transformer"]["posembed_input"]["pos_embedding"]
  assert resized.shape == (1, 577, 768)
  np.testing.assert_array_equal(resized[0, 0], np.arange(768))
  grid = resized[0, 1:].reshape(24, 24, 768)
  # Corners stay put; the ramp is resampled, not shifted or scaled.
  np.testing.assert_allclose(grid[:, 0, 0], np.linspace(0, 13, 24), atol=1e-5)
  np.testing.assert_allclose(grid[0, :, 1], np.linspace(0, 13, 24), atol=1e-5)


def test_posemb_at_equal_size_is_reproduced_exactly():
  posemb = np.random.default_rng(0).standard_normal((1, 197, 8))
  np.testing.assert_array_equal(
      adaptation.resize_posemb(posemb, (1, 197, 8), num_extra=1),
      posemb)
  gap = posemb[:, 1:]
  np.testing.assert_array_equal(
      adaptation.resize_posemb(gap, (1, 196, 8), num_extra=0), gap)


def test_adapt_replaces_head_and_drops_pre_logits(trained_tiny):
  _, pretrained = trained_tiny  # 7 classes, representation 24.
  finetune = models.create("Ti/4", num_classes=3, **TINY)
  target = init_params(finetune, 24, seed=5)
  adapted = adaptation.adapt(pretrained, target)
  assert "pre_logits" not in adapted
  np.testing.assert_array_equal(adapted["head"]["kernel"], 0.0)
  assert adapted["head"]["kernel"].shape == (32, 3)
  np.testing.assert_array_equal(
      adapted["Transformer"]["encoderblock_1"]["MlpBlock_3"]["Dense_0"]
      ["kernel"], pretrained["Transformer"]["encoderblock_1"]["MlpBlock_3"]
      ["Dense_0"]["kernel"])
  assert adapted["Transformer"]["posembed_input"]["pos_embedding"].shape == (
      1, 37, 32)
  logits = finetune.apply({"params": adapted}, images(2, 24), train=False)
  assert logits.shape == (2, 3)


def test_adapt_keeps_a_matching_head(trained_tiny):
  model, params = trained_tiny
  adapted = adaptation.adapt(params, init_params(model, 16, seed=9))
  assert_trees_equal(adapted, params)


def test_wrong_shaped_file_fails_naming_the_key(tmp_path, trained_tiny):
  _, params = trained_tiny
  files = flat(params)
  key = "Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"
  files[key] = np.zeros((32, 48), np.float32)
  path = tmp_path / "wrong.npz"
  np.savez(path, **files)
  model = models.create("Ti/4", num_classes=7, representation_size=24, **TINY)
  with pytest.raises(errors.InputError, match=re.escape(key)) as error:
    adaptation.adapt(npz_lib.load_npz(path), init_params(model, 16))
  assert "(32, 48)" in str(error.value) and "(32, 64)" in str(error.value)


def test_missing_and_unexpected_keys_are_named(trained_tiny):
  model, params = trained_tiny
  fewer_layers = models.create("Ti/4", num_classes=7, representation_size=24,
                               **dict(TINY, num_layers=2))
  with pytest.raises(errors.InputError, match="encoderblock_2"):
    adaptation.adapt(params, init_params(fewer_layers, 16))
  more_layers = models.create("Ti/4", num_classes=7, representation_size=24,
                              **dict(TINY, num_layers=4))
  with pytest.raises(errors.InputError, match="encoderblock_3"):
    adaptation.adapt(params, init_params(more_layers, 16))


def test_storage_failures_are_told_apart_from_bugs():
  assert paths.storage_failure(
      OSError(errno.ENOSPC, "No space left on device")) == (
          "No space left on device")
  # Tensorstore's form, from orbax's background writes.
  assert paths.storage_failure(ValueError(
      'RESOURCE_EXHAUSTED: Error writing "params.head" in OCDBT database: '
      "Failed to write 294181 bytes to file 15: No space left on device "
      "[os_error_code='28']")) == "No space left on device"
  try:
    try:
      raise PermissionError(errno.EACCES, "Permission denied", "/ckpt")
    except PermissionError as e:
      raise RuntimeError("commit failed") from e
  except RuntimeError as e:
    assert paths.storage_failure(e) == "Permission denied"
  assert paths.storage_failure(ValueError(
      "PERMISSION_DENIED: gs://bucket/run/checkpoints/5")).startswith(
          "PERMISSION_DENIED from storage")
  # TensorFlow's file errors (TensorBoard's writer) only say it.
  assert paths.storage_failure(RuntimeError(
      "events.out.tfevents.1; No space left on device\n\tFailed to flush 8 "
      "events")) == "No space left on device"
  # A bug stays a bug: its traceback is shown.
  assert paths.storage_failure(ValueError("shapes (3,) and (4,) do not "
                                         "match")) is None
  assert paths.storage_failure(OSError(errno.ENOENT, "gone")) is None


@pytest.mark.parametrize("options", [
    dict(layer_scale=0.1),
    dict(num_registers=4),
    dict(num_registers=2, classifier="gap"),
    dict(qk_norm=True),
    dict(classifier="map"),
    dict(classifier="map", num_registers=4, layer_scale=1e-5, qk_norm=True),
    dict(rope="axial", posemb="none", num_registers=4, layer_scale=1.0),
    dict(rope="axial", rope_theta=10.0, classifier="gap", attention="fused"),
    dict(mlp="swiglu", rope="axial", posemb="none", layer_scale=1.0),
])
def test_todays_options_match_the_float64_forward(options):
  """Layer scale, registers, query/key norm, attention pooling, 2-D
  rotary embeddings and the SwiGLU MLP (the parts of SigLIP, DINOv2,
  DINOv3 and timm's recent ViTs) against the reference."""
  model = models.create("Ti/4", num_classes=7, **TINY, **options)
  params = randomize(init_params(model, 16), seed=3)
  x = images(4, 16)
  expected = reference_vit.forward(
      flat(params), x, options.get("classifier", "token"),
      rope_theta=model.config.rope_theta if model.config.rope else None)
  got = model.apply({"params": params}, x, train=False)
  assert np.abs(expected).max() > 1  # Logits that say something.
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_a_siglip_image_tower_loads_and_computes_the_float64_forward(
    tmp_path):
  """The image tower of a two-tower SigLIP file in big_vision's names (no
  class token, position embedding at the top, attention pooling), beside
  its text tower: read with no config, and its logits (here: the tower's
  projection) are the reference's."""
  model = models.create("Ti/4", num_classes=5, classifier="map", **TINY)
  params = flat(randomize(init_params(model, 16), seed=5))
  tower = as_siglip_tower(params)
  text = {"params/txt/Encoder_0/encoder_norm/scale": np.ones(8, np.float32),
          "params/t": np.ones(1, np.float32), "params/b": np.zeros(1)}
  path = tmp_path / "siglip.npz"
  np.savez(path, **tower, **text)
  loaded = pretrained.for_inference(str(path))
  assert loaded.model.config.classifier == "map" and loaded.image_size == 16
  x = images(3, 16)
  expected = reference_vit.forward(params, x, "map")
  got = loaded.model.apply({"params": loaded.params}, x, train=False)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def as_naflex_tower(params):
  """`as_siglip_tower`, as big_vision's NaFlex ViT (SigLIP 2 NaFlex) holds
  it: the patch embedding a Dense [p*p*3, D], the position table [G, G, D]."""
  tower = as_siglip_tower(params)
  kernel = tower["params/img/embedding/kernel"]
  tower["params/img/embedding/kernel"] = kernel.reshape(-1, kernel.shape[-1])
  posemb = tower["params/img/pos_embedding"]
  side = int(np.sqrt(posemb.shape[1]))
  tower["params/img/pos_embedding"] = posemb.reshape(side, side, -1)
  return tower


def test_a_siglip2_naflex_image_tower_loads(tmp_path):
  model = models.create("S/4", 5, hidden_size=32, num_layers=2, num_heads=4,
                        mlp_dim=64, classifier="map")
  shapes = flat(jax.eval_shape(lambda: init_params(model, 16)))
  rng = np.random.default_rng(6)
  params = {k: rng.standard_normal(s.shape).astype(np.float32)
            for k, s in shapes.items()}
  tower = as_naflex_tower(params)
  assert tower["params/img/embedding/kernel"].shape == (48, 32)
  assert tower["params/img/pos_embedding"].shape == (4, 4, 32)
  assert "params/img/Transformer/encoderblock_1/MlpBlock_0/Dense_0/kernel" in (
      tower)
  path = tmp_path / "naflex.npz"
  np.savez(path, **tower)
  assert_trees_equal(npz_lib.load_npz(path),
                     flax.traverse_util.unflatten_dict(params, sep="/"))
  read = flat(npz_lib.read_shapes(path))
  assert {k: v.shape for k, v in read.items()} == {
      k: v.shape for k, v in params.items()}

  # Patch LayerNorms that our model does not compute are refused.
  np.savez(path, **tower, **{"params/img/patchln_pre/scale": np.ones(48),
                             "params/img/patchln_pre/bias": np.zeros(48)})
  with pytest.raises(errors.InputError, match=r"\['patchln_pre'\]"):
    npz_lib.load_npz(path)
  with pytest.raises(errors.InputError, match=r"\['patchln_pre'\]"):
    npz_lib.read_shapes(path)
