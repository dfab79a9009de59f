"""The R50+ViT hybrids: sizes, the released layout, logits, training."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import reference_vit
from tests.test_compute import xla_forward_flops
from tests.test_train import MESHES, first_losses
from tests.util import randomize, small_config
from vit_jax import errors, models
from vit_jax.models import flops
from vit_jax.weights import npz as npz_lib

# Two stages of one unit at a root width of 32: 8 times smaller feature
# maps, the smallest stem with a strided stage and GroupNorm's 32 groups.
TINY_HYBRID = dict(hidden_size=32, num_layers=2, mlp_dim=64, num_heads=4,
                   resnet_stages=(1, 1), resnet_width=32)


def param_shapes(model, image_size):
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)),
      train=False))["params"]
  return flax.traverse_util.flatten_dict(flax.linen.meta.unbox(shapes),
                                         sep="/")


def count(shapes, prefix=""):
  return sum(int(np.prod(s.shape)) for k, s in shapes.items()
             if k.startswith(prefix))


@pytest.mark.parametrize("image_size,tokens,count_",
                         [(224, 197, 98_659_112), (384, 577, 98_950_952)])
def test_r50_b16_sizes_at_224_and_384(image_size, tokens, count_):
  model = models.create("R50+B/16", num_classes=1000)
  assert (model.config.resnet_stages, model.config.patch_size,
          model.token_stride) == ((3, 4, 9), 1, 16)
  shapes = param_shapes(model, image_size)
  # The stem's 11.9M (ResNet-50 without stage 4, whose 3 units go to stage
  # 3) and B/16 reading 1024 channels through a 1x1 patch; at 384, timm
  # lists the same model at 98.95M.
  assert count(shapes) == count_
  assert shapes["conv_root/kernel"].shape == (7, 7, 3, 64)
  assert shapes["block3/unit9/conv3/kernel"].shape == (1, 1, 256, 1024)
  assert shapes["embedding/kernel"].shape == (1, 1, 1024, 768)
  assert shapes[models.POSEMB_KEY].shape == (1, tokens, 768)
  logits = jax.eval_shape(
      lambda p, x: model.apply({"params": p}, x, train=False),
      flax.traverse_util.unflatten_dict(shapes, sep="/"),
      jax.ShapeDtypeStruct((2, image_size, image_size, 3), jnp.float32))
  assert logits.shape == (2, 1000)


def test_the_r50_stem_has_resnet50s_parameters():
  # Torchvision's ResNet-50 has 25,557,032 parameters with its 2048 x 1000
  # classifier (BatchNorm and GroupNorm both learn a scale and a bias).
  stem = count(param_shapes(models.create("R50+B/32", 1000), 224),
               prefix=("conv_root", "gn_root", "block"))
  assert stem + 2048 * 1000 + 1000 == 25_557_032


@pytest.mark.parametrize("name,stages", [
    ("R50+L/32", (3, 4, 6, 3)), ("R26+S/32", (2, 2, 2, 2))])
def test_hybrid_names(name, stages):
  model = models.create(name, num_classes=10)
  assert model.config.resnet_stages == stages and model.token_stride == 32
  with pytest.raises(errors.InputError, match="unknown hybrid 'R26\\+B/16'"):
    models.create("R26+B/16", num_classes=10)


def test_hybrid_logits_match_the_float64_forward_through_the_release_layout(
    tmp_path):
  model = models.create("Ti/1", num_classes=7, representation_size=24,
                        **TINY_HYBRID)
  variables = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(
      jnp.zeros((1, 32, 32, 3)))
  params = randomize(flax.linen.meta.unbox(variables["params"]), seed=3)
  path = tmp_path / "hybrid.npz"
  npz_lib.save_npz(params, path)
  with np.load(path) as npz:
    stored = dict(npz)
  for key in ("conv_root/kernel", "gn_root/scale", "gn_root/bias",
              "block1/unit1/conv_proj/kernel", "block1/unit1/gn_proj/scale",
              "block2/unit1/conv2/kernel", "block2/unit1/gn3/bias"):
    assert key in stored, key
  loaded = npz_lib.load_npz(path)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  read, image_size = models.from_params(loaded)
  assert read == model and image_size == 32

  x = np.random.default_rng(1).uniform(-1, 1, (3, 32, 32, 3)).astype(
      np.float32)
  expected = reference_vit.forward(stored, x)
  got = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))(
      loaded, x)
  assert np.abs(expected).max() > 1  # Logits that say something.
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_hybrid_flops_agree_with_xla():
  assert flops.flops_per_image("R50+B/16", 224) == pytest.approx(
      xla_forward_flops("R50+B/16", 224), rel=0.05)


def test_a_hybrid_trains_alike_on_one_device_and_on_a_mesh_of_every_axis(
    digits_data_dir):
  # The encoder trains alike on all four of MESHES (test_train); what is new
  # here is the stem's sharding, which one mesh of data, fsdp and model
  # exercises. One stage (a root and a unit with its projection) and one
  # encoder block keep the compiles short; 16 px make a 4 x 4 grid.
  overrides = {f"model.{k}": v for k, v in TINY_HYBRID.items()}
  losses = {}
  for name in ("1 device", "data 2 x fsdp 2 x model 2"):
    mesh, num_devices = MESHES[name]
    config = small_config(digits_data_dir, mesh=mesh, image_size=16, **{
        **overrides, "model.name": "R50+Ti/16", "model.resnet_stages": (1,),
        "model.num_layers": 1})
    losses[name], _ = first_losses(config, jax.devices()[:num_devices])
  reference = losses["1 device"]
  assert reference[-1] != reference[0]  # The steps change the model.
  for name, values in losses.items():
    np.testing.assert_allclose(values, reference, rtol=1e-5, err_msg=name)
