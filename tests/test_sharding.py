"""The mesh from config.mesh, and the rules for single arrays."""

import jax
import pytest

from vit_jax import errors, sharding


def test_minus_one_takes_the_remaining_devices():
  mesh = sharding.make_mesh({"data": -1, "model": 2})
  assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "model": 2}
  assert mesh.axis_names == ("data", "fsdp", "model")


@pytest.mark.parametrize("axes,message", [
    ({"data": 3}, "needs 3 devices, but there are 8"),
    ({"data": -1, "fsdp": -1}, "only one axis may be -1"),
    ({"dp": 8}, "unknown axes ['dp']"),
    ({"data": 0, "fsdp": 8}, "positive or -1"),
])
def test_bad_meshes_are_refused(axes, message):
  with pytest.raises(errors.InputError, match=message.replace("[", r"\[")):
    sharding.make_mesh(axes)


def test_over_two_slices_only_the_data_axis_crosses_between_them():
  from vit_jax.planning import catalogue  # pylint: disable=g-import-not-at-top
  devices = catalogue.topology("v5p-8", slices=2).devices  # 4 chips each.
  mesh = sharding.make_mesh({"data": -1, "fsdp": 2, "slices": -1}, devices)
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}
  # Slice 0 holds data rows 0-1, slice 1 rows 2-3: every fsdp group, and
  # so every gathered weight, stays inside a slice.
  assert [{d.slice_index for d in row.flat} for row in mesh.devices] == [
      {0}, {0}, {1}, {1}]
  assert sorted(mesh.devices.flat, key=lambda d: d.id) == sorted(
      devices, key=lambda d: d.id)
  assert dict(sharding.make_mesh({"data": 2, "fsdp": 4, "slices": 2},
                                 devices).shape)["fsdp"] == 4
  for axes, message in [
      ({"data": 1, "fsdp": 8}, "data=1 is not a multiple of 2; only the data "
       "axis crosses between slices"),
      ({"data": -1, "slices": 1}, "slices=1, but the 8 devices are in 2 "
       "slices"),
      ({"data": -1, "slices": 0}, "slices must be positive or -1")]:
    with pytest.raises(errors.InputError, match=message):
      sharding.make_mesh(axes, devices)
  # On CPU a process stands for a slice: this one has one.
  with pytest.raises(errors.InputError, match="slices=2, but the 8 devices "
                     "are in 1 process "):
    sharding.make_mesh({"data": -1, "slices": 2})


def test_fsdp_leaves_arrays_under_its_floor_whole():
  mesh = sharding.make_mesh({"fsdp": 4, "model": 2, "fsdp_min_bytes": 1})
  spec = lambda shape, floor: sharding.partition_spec(
      ("embed", "mlp"), shape, mesh, fsdp_min_bytes=floor)
  # 768 x 3072 float32 is 9 MiB: split at a 4 MiB floor, as without one.
  assert spec((768, 3072), 4 * 2**20) == spec((768, 3072), 0) == jax.P(
      "fsdp", "model")
  # 64 x 256 (64 KiB) stays whole over fsdp; the model axis still splits it.
  assert spec((64, 256), 4 * 2**20) == jax.P(None, "model")
  assert spec((64, 256), 64 * 2**10) == jax.P("fsdp", "model")  # At it.
  # Over a model's params: the head's 7.5 KiB kernel stays whole under a
  # 256 KiB floor, the 576 KiB patch embedding is split.
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  model = models.create("Ti/16", 10, num_layers=1)
  boxed = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jax.numpy.zeros((1, 32, 32, 3)), train=False))
  fsdp_8 = sharding.make_mesh({"data": 1, "fsdp": 8})
  for floor, head in [(0, jax.P("fsdp", None)), (2**18, jax.P(None, None))]:
    specs = {jax.tree_util.keystr(path): s.spec for path, s in
             jax.tree_util.tree_flatten_with_path(
                 sharding.tree_shardings(boxed, fsdp_8, floor))[0]}
    assert specs["['params']['head']['kernel']"] == head
    assert "fsdp" in specs["['params']['embedding']['kernel']"]
  # A run's config sets it: the digits model's head (64 x 10) and its
  # Adam moments stay whole on fsdp 8, its MLP kernels (64 x 256) split.
  from configs import digits  # pylint: disable=g-import-not-at-top
  from tests.util import program_of  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  config.update_from_flattened_dict({"mesh.data": 1, "mesh.fsdp": 8,
                                     "mesh.fsdp_min_bytes": 4096})
  shardings = program_of(config).state_shardings
  head = shardings.params["head"]["kernel"].spec
  mlp = shardings.params["Transformer"]["encoderblock_0"]["MlpBlock_3"][
      "Dense_0"]["kernel"].spec
  assert head == jax.P(None, None) and "fsdp" in mlp
  moments = [s.spec for path, s in jax.tree_util.tree_flatten_with_path(
      shardings.opt_state)[0] if "['head']['kernel']" in
              jax.tree_util.keystr(path)]
  assert len(moments) == 2 and set(moments) == {head}  # mu and nu.


def test_fsdp_takes_the_largest_free_divisible_dimension():
  mesh = sharding.make_mesh({"fsdp": 4, "model": 2})
  spec = lambda names, shape: sharding.partition_spec(names, shape, mesh)
  assert spec(("embed", "mlp"), (768, 3072)) == jax.P("fsdp", "model")
  assert spec(("embed", "heads", "kv"), (768, 12, 64)) == jax.P(
      "fsdp", "model", None)
  # 10 classes do not divide by 4: FSDP falls back to the width.
  assert spec((None, "classes"), (768, 10)) == jax.P("fsdp", None)
  assert spec(("embed",), (6,)) == jax.P(None)  # Nothing divisible: replicate.
  # A scanned model's stack of 32 blocks is larger than its biases' width,
  # but each scan step takes one block: FSDP splits within the block.
  assert spec(("layers", "embed"), (32, 16)) == jax.P(None, "fsdp")
  assert spec(("layers", "embed", "mlp"), (32, 768, 3072)) == jax.P(
      None, "fsdp", "model")


def test_rule_sharded_dimension_must_divide():
  mesh = sharding.make_mesh({"data": 4, "model": 2})
  with pytest.raises(errors.InputError,
                     match="heads, size 3.*'model' of size 2"):
    sharding.partition_spec(("embed", "heads", "kv"), (48, 3, 16), mesh,
                            "query/kernel")
