"""`predict --features`: the pooled features that a model's head reads, of
headless towers (SigLIP 2, DINOv2 with registers, built with numpy as
test_todays_checkpoints.py builds them) and of models with a head.

The towers' features are checked against tests/reference_vit.py's float64
forwards with no head, which return the pooled output as transformers
computes it (SigLIP's pooler output, DINOv2's normalised class token).
"""

import json

import flax
import jax
import numpy as np
import pytest
import tensorflow as tf

from tests import reference_vit
from tests.test_naflex import patchify
from tests.test_todays_checkpoints import (
  REGISTERS,
  dinov2_config,
  dinov2_shapes,
  dinov3_config,
  dinov3_shapes,
  eva_dinov3_file,
  siglip_tensors,
)
from tests.test_torch_interchange import (
  HEADS,
  PATCH,
  SIDE,
  WIDTH,
  images,
  random_tensors,
  write_hf_dir,
)
from tests.util import call_tool, run_tool
from vit_jax import errors, models
from vit_jax.analysis import features
from vit_jax.data import image_files
from vit_jax.models import naflex
from vit_jax.weights import function_exports, pretrained


def assert_close(ours, expected):
  assert ours.dtype == np.float32 and ours.shape == expected.shape
  assert np.abs(expected).max() > 0.1  # Features that say something.
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)
  relative = np.linalg.norm(ours - expected) / np.linalg.norm(expected)
  assert relative < 1e-5


def siglip2_dir(tmp_path):
  tensors, config = siglip_tensors(siglip2=True, names="hub")
  return write_hf_dir(tmp_path / "siglip2", tensors, config), tensors


def test_a_siglip2_tower_gives_its_pooler_output(tmp_path):
  source, tensors = siglip2_dir(tmp_path)
  inference = pretrained.for_inference(source, features=True)
  assert inference.model.num_classes == 0  # Its placeholder head.
  x = images()
  assert_close(features.features(inference, x, batch_size=2),
               reference_vit.forward_siglip(tensors, x, HEADS, 1e-6, "tanh"))


def test_a_dinov2_with_registers_gives_its_class_token(tmp_path):
  tensors = random_tensors(dinov2_shapes(REGISTERS))
  source = write_hf_dir(tmp_path / "dinov2", tensors,
                        dinov2_config(REGISTERS))
  inference = pretrained.for_inference(source, features=True)
  assert inference.model.config.num_registers == REGISTERS
  x = images()
  assert_close(features.features(inference, x),
               reference_vit.forward_dinov2(tensors, x, HEADS, 1e-6,
                                            "exact"))


def test_a_headless_source_is_refused_for_classes_naming_features(tmp_path):
  source, _ = siglip2_dir(tmp_path)
  with pytest.raises(errors.InputError,
                     match="no classification head.*--features"):
    pretrained.for_inference(source)


def test_a_model_with_a_head_gives_its_pre_logits(tmp_path):
  # Average pooling, fc_norm and a tanh pre-logits layer: all read.
  model = models.create("Ti/16", num_classes=3, hidden_size=WIDTH,
                        num_layers=1, mlp_dim=64, num_heads=HEADS,
                        patch_size=4, classifier="gap", final_norm="pooled",
                        representation_size=8)
  x = images()
  params = model.init(jax.random.key(0), x, train=False)["params"]
  params = jax.tree.map(np.asarray, params)
  inference = pretrained.Inference(model, params, SIDE, "tiny", None)
  ours = features.features(inference, x)
  _, pre_logits, _ = function_exports.inference_function(inference)(x)
  np.testing.assert_allclose(ours, pre_logits, rtol=1e-6, atol=1e-6)
  assert ours.shape == (len(x), 8)

  # A StableHLO export gives the same, from its pre_logits output.
  out = str(tmp_path / "tiny.stablehlo")
  function_exports.write_stablehlo(inference, out)
  pixels = np.random.default_rng(0).integers(0, 256, (3, SIDE, SIDE, 3),
                                             np.uint8)
  np.testing.assert_allclose(
      features.of_export(function_exports.load_stablehlo(out), pixels, 2),
      features.features(inference, pixels), rtol=1e-5, atol=1e-6)


def test_predict_prints_a_towers_features_as_json(tmp_path):
  source, _ = siglip2_dir(tmp_path)
  png = str(tmp_path / "image.png")
  pixels = np.random.default_rng(1).integers(0, 256, (20, 24, 3), np.uint8)
  tf.io.write_file(png, tf.io.encode_png(pixels))
  (line,) = run_tool("predict", f"--from={source}", "--features", "--json",
                     png).splitlines()
  shown = json.loads(line)
  assert shown["image"] == png and len(shown["features"]) == WIDTH
  inference = pretrained.for_inference(source, features=True)
  expected = features.features(inference, image_files.from_files(
      [png], inference.image_size))[0]
  np.testing.assert_allclose(shown["features"], expected, rtol=1e-5,
                             atol=1e-6)
  text = features.as_text(png, expected)
  assert text.startswith(f"{png}\n  width {WIDTH}, L2 norm ")


def test_predict_reads_each_image_at_its_own_aspect_ratio(tmp_path):
  """--max_num_patches: a SigLIP 2 tower's features NaFlex-style, with each
  image's grid; an image already at its grid's size is not resampled, so
  its features are the float64 reference's on its very pixels."""
  source, _ = siglip2_dir(tmp_path)
  rng = np.random.default_rng(2)
  sized = rng.integers(0, 256, (3 * PATCH, 8 * PATCH, 3), np.uint8)
  tall = rng.integers(0, 256, (30, 10, 3), np.uint8)
  files = [str(tmp_path / name) for name in ("sized.png", "tall.png")]
  for file, pixels in zip(files, (sized, tall)):
    tf.io.write_file(file, tf.io.encode_png(pixels))
  lines = run_tool("predict", f"--from={source}", "--features", "--json",
                   "--max_num_patches=24", *files).splitlines()
  shown = [json.loads(line) for line in lines]
  assert [line["grid"] for line in shown] == [
      [3, 8], list(naflex.grid_for(30, 10, PATCH, 24))]
  assert shown[1]["grid"] == [8, 3]  # Tall, 24 patches of the budget.
  patches, _ = patchify(sized / 127.5 - 1, PATCH, 24)
  flat = flax.traverse_util.flatten_dict(pretrained.load(source).params,
                                        sep="/")
  expected = reference_vit.forward_naflex(flat, patches, (3, 8), "map",
                                          features=True)
  np.testing.assert_allclose(shown[0]["features"], expected, rtol=1e-5,
                             atol=1e-5)


def _features_line(*args):
  """(the features predict --features --json prints for one image, its
  stderr's lines)."""
  status, stdout, stderr = call_tool("predict", "--features", "--json", *args)
  assert status == 0, stderr[-2000:]
  (line,) = stdout.splitlines()
  return json.loads(line)["features"], stderr.splitlines()


def test_predict_gives_a_dinov3s_features_on_its_own_input(tmp_path):
  """DINOv3s take (pixels / 255 - mean) / std, not [-1, 1]: predict gives
  the source's features of its own input, for pictures at the model's
  grid (not resampled). An HF directory's image processor says its mean
  and std; a timm file says none: ImageNet's are assumed, in one line,
  and --input_mean and --input_std change them."""
  rng = np.random.default_rng(3)
  tensors = random_tensors(dinov3_shapes(REGISTERS))
  source = write_hf_dir(tmp_path / "hf", tensors, dinov3_config(REGISTERS))
  mean, std = np.array([0.4, 0.5, 0.6]), np.array([0.2, 0.25, 0.3])
  (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps({
      "image_processor_type": "DINOv3ViTImageProcessorFast",
      "do_normalize": True, "image_mean": list(mean),
      "image_std": list(std)}))
  pixels = rng.integers(0, 256, (SIDE, SIDE, 3), np.uint8)
  png = str(tmp_path / "square.png")
  tf.io.write_file(png, tf.io.encode_png(pixels))
  shown, said = _features_line(f"--from={source}", png)
  assert not [line for line in said if line.startswith("note:")]
  expected = reference_vit.forward_dinov3(
      tensors, ((pixels / 255 - mean) / std)[None], HEADS)[0]
  np.testing.assert_allclose(shown, expected, rtol=1e-4, atol=1e-4)

  tensors, path = eva_dinov3_file(tmp_path)
  pixels = rng.integers(0, 256, (SIDE, 24, 3), np.uint8)
  png = str(tmp_path / "wide.png")
  tf.io.write_file(png, tf.io.encode_png(pixels))
  args = (f"--from={path}", f"--num_heads={HEADS}", "--max_num_patches=100",
          png)
  shown, said = _features_line(*args)
  assert said.count(
      f"note: {path} says nothing of its input; assuming "
      "--input_mean=0.485,0.456,0.406 --input_std=0.229,0.224,0.225 (give "
      "those flags to change it)") == 1
  imagenet = (pixels / 255 - np.array([0.485, 0.456, 0.406])) / np.array(
      [0.229, 0.224, 0.225])
  expected = reference_vit.forward_eva_dinov3(tensors, imagenet[None], HEADS)
  np.testing.assert_allclose(shown, expected[0], rtol=1e-4, atol=1e-4)
  shown, said = _features_line(*args, "--input_mean=0.5,0.5,0.5",
                               "--input_std=0.5,0.5,0.5")
  assert not [line for line in said if line.startswith("note:")]
  expected = reference_vit.forward_eva_dinov3(
      tensors, (pixels / 127.5 - 1)[None], HEADS)
  np.testing.assert_allclose(shown, expected[0], rtol=1e-4, atol=1e-4)
