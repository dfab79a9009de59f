"""transformers' ViTMAEForPreTraining read and written
(vit_jax/weights/pytorch/mae.py), against what transformers 5.24 computed
(tests/fixtures/libraries/hf_vit_mae*, recorded by
benchmarks/record_libraries.py; the README there says what each file is).

Each recorded masked autoencoder (a small random encoder and decoder,
`mask_ratio=0.75`, without and with `norm_pix_loss`) is run by
`objectives.mae.reconstruct` on the recorded images and noise, in float32,
and compared with the library's float64 loss, pixel predictions, mask and
encoder output; written back, it is the very same tensors. A model of ours
with fixed sin-cos positions (no table in its params) is written and read
back, computing the same. No torch here.
"""

import dataclasses
import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.util import randomize
from vit_jax import errors, models
from vit_jax.models import mae as mae_lib, positions
from vit_jax.training.objectives import mae as objective
from vit_jax.weights import pretrained
from vit_jax.weights.pytorch import mae as pytorch_mae

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "libraries")
# The recorded families this file checks (test_recorded_libraries.py's
# test_every_recorded_family_is_tested counts them as tested).
FAMILIES = ("hf_vit_mae", "hf_vit_mae_norm_pix")
# float32 here against transformers' float64: measured at 4.4e-7 relative
# to the largest value at most (docs/pytorch.md).
RTOL, ATOL = 1e-4, 1e-5
# What a written config.json leaves out of the library's: what
# save_pretrained adds of its own.
UNWRITTEN_CONFIG = ("dtype", "transformers_version")


def recorded(family):
  """(the HF directory, inputs, outputs) of a recorded family."""
  folder = os.path.join(FIXTURES, family)
  return (os.path.join(folder, "hf"),
          load_file(os.path.join(folder, "inputs.safetensors")),
          load_file(os.path.join(folder, "outputs.safetensors")))


def flat(params):
  return flax.traverse_util.flatten_dict(params, sep="/")


def encoded(model, params, images, noise):
  """The encoder's output on the class token and the kept patches, in
  ascending noise order (transformers' `last_hidden_state`)."""
  keep = mae_lib.kept(noise, mae_lib.keep_count(noise.shape[1],
                                                model.mask_ratio))
  tokens = model.apply(
      {"params": params}, images, train=False,
      method=lambda module, x, train: module.encoder(x, train=train,
                                                     keep=keep))
  return tokens.values


@pytest.mark.parametrize("family", FAMILIES)
def test_reconstruct_computes_as_transformers(family):
  directory, inputs, outputs = recorded(family)
  images, noise = inputs["square/images"], inputs["square/noise"]
  loss, logits, mask = objective.reconstruct(directory, images, noise)
  np.testing.assert_array_equal(mask, outputs["square/mask"])
  np.testing.assert_allclose(logits, outputs["square/logits"], rtol=RTOL,
                             atol=ATOL)
  np.testing.assert_allclose(np.reshape(loss, (1,)), outputs["square/loss"],
                             rtol=RTOL, atol=ATOL)
  model, params, norm_pix_loss = pytorch_mae.read_mae(directory)
  assert norm_pix_loss == (family == "hf_vit_mae_norm_pix")
  assert (model.mask_ratio, model.config.gelu,
          model.config.layer_norm_epsilon) == (0.75, "exact", 1e-12)
  assert (model.decoder.hidden_size, model.decoder.num_layers,
          model.decoder.num_heads, model.decoder.mlp_dim) == (32, 2, 4, 64)
  np.testing.assert_allclose(
      encoded(model, params, images, noise),
      outputs["square/last_hidden_state"], rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
      mae_lib.pixel_targets(images, model.config.patch_size, norm_pix_loss),
      outputs["square/target"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_written_back_is_the_same_file(tmp_path, family):
  directory, _, _ = recorded(family)
  model, params, norm_pix_loss = pytorch_mae.read_mae(directory)
  out = str(tmp_path / "back")
  pytorch_mae.write_mae(out, model, params, norm_pix_loss)
  original = load_file(os.path.join(directory, "model.safetensors"))
  written = load_file(os.path.join(out, "model.safetensors"))
  # Written in the hub's block names; the recorded file has transformers
  # 5.24's.
  blocks = pytorch_mae.DECODER_BLOCKS
  assert any(name.startswith(blocks[0]) for name in written)
  written = {name.replace(blocks[0], blocks[1]): value
             for name, value in written.items()}
  assert sorted(written) == sorted(original)
  for name, value in original.items():
    assert written[name].dtype == value.dtype, name
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  with open(os.path.join(directory, "config.json")) as f:
    theirs = json.load(f)
  with open(os.path.join(out, "config.json")) as f:
    ours = json.load(f)
  assert ours == {key: value for key, value in theirs.items()
                  if key not in UNWRITTEN_CONFIG}
  back, back_params, back_norm_pix_loss = pytorch_mae.read_mae(out)
  assert (back.config, back.decoder, back.mask_ratio, back_norm_pix_loss) == (
      model.config, model.decoder, model.mask_ratio, norm_pix_loss)
  assert flat(back_params).keys() == flat(params).keys()
  for key, value in flat(params).items():
    np.testing.assert_array_equal(flat(back_params)[key], value,
                                  err_msg=key)


def small_mae(**encoder_options):
  """A small masked autoencoder of ours with fixed sin-cos positions (no
  table in its params), its params drawn and perturbed."""
  encoder = models.ViTConfig(**{
      **dict(patch_size=8, hidden_size=48, num_layers=2, num_heads=4,
             mlp_dim=96, classifier="token", posemb="sincos2d", gelu="tanh",
             layer_norm_epsilon=1e-6), **encoder_options})
  model = mae_lib.MaskedAutoencoder(
      encoder, mae_lib.decoder_config(encoder, mae_lib.DecoderSizes(
          32, 2, 4, 64)), mask_ratio=0.75)
  params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)),
                      train=False)["params"]
  params = flax.core.meta.unbox(params)
  return model, randomize(jax.tree.map(np.asarray, params), seed=1)


def test_a_sincos2d_model_written_and_read_back_computes_the_same(tmp_path):
  model, params = small_mae()
  out = str(tmp_path / "mae")
  pytorch_mae.write_mae(out, model, params, norm_pix_loss=True,
                        image_size=32)
  written = load_file(os.path.join(out, "model.safetensors"))
  for name, width in (("vit.embeddings.position_embeddings", 48),
                      ("decoder.decoder_pos_embed", 32)):
    # Ours, row first: transformers adds the table as it is stored.
    np.testing.assert_array_equal(written[name][0, 0], np.zeros(width))
    np.testing.assert_array_equal(written[name][0, 1:],
                                  positions.sincos2d_table(4, 4, width))
  back, back_params, norm_pix_loss = pytorch_mae.read_mae(out)
  assert norm_pix_loss
  assert back.config == dataclasses.replace(model.config, posemb="learn")
  assert back.decoder == dataclasses.replace(model.decoder, posemb="learn")
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (3, 32, 32, 3)).astype(np.float32)
  noise = rng.random((3, 16)).astype(np.float32)
  ours = objective.reconstruct_with(model, params, images, noise, True)
  read = objective.reconstruct_with(back, back_params, images, noise, True)
  np.testing.assert_array_equal(ours[2], read[2])  # The mask.
  # Not bitwise: our encoder computes its "sincos2d" at each kept patch's
  # place in float32 (models/positions.py's `sincos2d`), within 6e-8 of
  # the table written (computed in float64); measured at 5.3e-7 of the
  # largest prediction.
  for a, b in ((ours[0], read[0]), (ours[1], read[1]),
               (encoded(model, params, images, noise),
                encoded(back, back_params, images, noise))):
    assert relative(a, b) < 1e-6


def relative(got, expected):
  """The largest difference relative to the largest expected value."""
  expected = np.asarray(expected, np.float64)
  return float(np.abs(np.asarray(got, np.float64) - expected).max() /
               np.abs(expected).max())


def test_what_vit_mae_cannot_hold_is_refused(tmp_path):
  for options, part in (({"num_registers": 2}, "registers"),
                        ({"layer_scale": 1.0}, "layer scale"),
                        ({"qk_norm": True}, "query/key norms"),
                        ({"mlp": "swiglu"}, "SwiGLU"),
                        ({"rope": "axial", "posemb": "none"}, "rope")):
    model, params = small_mae(**options)
    with pytest.raises(errors.InputError, match=part):
      pytorch_mae.write_mae(str(tmp_path / "no"), model, params, False, 32)
  model, params = small_mae()
  for decoder, part in (({"layer_norm_epsilon": 1e-5}, "layer_norm_epsilon"),
                        ({"gelu": "exact"}, "gelu"),
                        ({"posemb": "learn2d"}, "learn2d")):
    other = model.clone(decoder=dataclasses.replace(model.decoder, **decoder))
    with pytest.raises(errors.InputError, match=part):
      pytorch_mae.write_mae(str(tmp_path / "no"), other, params, False, 32)
  with pytest.raises(errors.InputError, match="give image_size"):
    pytorch_mae.write_mae(str(tmp_path / "no"), model, params, False)
  with pytest.raises(errors.InputError, match="no multiple"):
    pytorch_mae.write_mae(str(tmp_path / "no"), model, params, False, 30)
  assert not os.path.exists(tmp_path / "no")
  # A classifier's directory is no masked autoencoder.
  with pytest.raises(errors.InputError, match="ViTMAEForPreTraining"):
    objective.reconstruct(os.path.join(FIXTURES, "hf_vit_classifier", "hf"),
                          np.zeros((1, 32, 32, 3), np.float32),
                          np.zeros((1, 16), np.float32))


def test_its_encoder_is_read_as_a_vit(tmp_path):
  """pretrained's readers take a ViTMAEForPreTraining as its encoder: a
  classifier-less ViT (the decoder left out), for features and init_from,
  that computes what the masked autoencoder's encoder does unmasked."""
  directory, inputs, _ = recorded("hf_vit_mae")
  model, params, _ = pytorch_mae.read_mae(directory)
  options = pretrained.source_options(directory)
  assert (options["posemb"], options["classifier"], options["gelu"],
          options["layer_norm_epsilon"]) == ("learn", "token", "exact", 1e-12)
  with pytest.raises(errors.InputError, match="no classification head"):
    pretrained.for_inference(directory)
  vit, vit_params = pretrained.for_inference(directory, features=True)
  encoder = {key: value for key, value in flat(params).items()
             if not key.startswith("decoder/")}
  assert flat(vit_params).keys() - {"head/kernel", "head/bias"} == (
      encoder.keys())
  for key, value in encoder.items():
    np.testing.assert_array_equal(flat(vit_params)[key], value, err_msg=key)
  images = inputs["square/images"]
  _, state = vit.apply(
      {"params": vit_params}, images, train=False, mutable=["intermediates"],
      capture_intermediates=lambda module, method: (
          module.name == "Transformer" and method == "__call__"))
  (tokens,) = [value[0] for key, value in flat(state["intermediates"]).items()
               if key.endswith("Transformer/__call__")]
  ours = model.apply({"params": params}, images, method="encode").values
  np.testing.assert_allclose(tokens, ours, rtol=1e-6, atol=1e-6)
