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
