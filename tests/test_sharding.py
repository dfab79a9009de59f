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
