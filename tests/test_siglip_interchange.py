"""transformers' two-tower SiglipModel and Siglip2Model read and written
(vit_jax/weights/pytorch/siglip.py), against what transformers 5.24
computed (tests/fixtures/libraries/hf_siglip_two_towers and
hf_siglip2_two_towers, recorded by benchmarks/record_libraries.py; the
README there says what each file is).

Each recorded model (a small random image tower as the other families',
a text tower of width 32 over 16 tokens, every parameter perturbed) is run
by `objectives.image_text.contrastive_logits` on the recorded images (or,
for SigLIP 2, NaFlex patches of two grids) and token ids, in float32, and
compared with the library's float64 logits_per_image; written back, it is
the very same tensors, and its config says what the library's said. A
two-tower run of ours is written and read back, computing the same. No
torch here.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from safetensors.numpy import load_file

from tests.util import randomize
from vit_jax import errors
from vit_jax.models import naflex
from vit_jax.training.objectives import image_text
from vit_jax.weights import big_vision
from vit_jax.weights.pytorch import siglip

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "libraries")
# The recorded families this file checks (test_recorded_libraries.py's
# test_every_recorded_family_is_tested counts them as tested), and the
# model_type each is written back as.
FAMILIES = {"hf_siglip_two_towers": "siglip",
            "hf_siglip2_two_towers": "siglip2",
            "big_vision_siglip": "big_vision"}
SOURCE = os.path.join(FIXTURES, "hf_siglip_two_towers", "hf")


def source_of(family):
  if FAMILIES[family] == "big_vision":
    return os.path.join(FIXTURES, family, "model.npz")
  return os.path.join(FIXTURES, family, "hf")


def recorded(family="hf_siglip_two_towers"):
  """(images or NaFlex patches, token ids, outputs) of a family."""
  folder = os.path.join(FIXTURES, family)
  inputs = load_file(os.path.join(folder, "inputs.safetensors"))
  outputs = load_file(os.path.join(folder, "outputs.safetensors"))
  images = (inputs["square/images"] if "square/images" in inputs else
            naflex.Patches(inputs["square/patches"], inputs["square/grids"]))
  return images, inputs["square/token_ids"], outputs


def relative(got, expected):
  expected = np.asarray(expected, np.float64)
  return float(np.abs(np.asarray(got, np.float64) - expected).max()
               / np.abs(expected).max())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_contrastive_logits_are_transformers_logits_per_image(family):
  """Both towers, t and b: 1e-4 of the largest logit (float32 against
  float64), and the embeddings likewise."""
  images, ids, outputs = recorded(family)
  source = source_of(family)
  logits = image_text.contrastive_logits(source, images, ids)
  expected = outputs["square/logits_per_image"]
  assert logits.shape == expected.shape == (2, 3)
  assert np.ptp(expected) > 1  # pairs told apart by more than b
  assert relative(logits, expected) < 1e-4
  model, params = image_text.two_towers_of(source)
  embedded = model.apply({"params": params}, images, ids, train=False)
  assert relative(embedded.images, outputs["square/image_embeds"]) < 1e-5
  assert relative(embedded.texts, outputs["square/text_embeds"]) < 1e-5


def test_big_visions_two_tower_npz_written_back_is_the_same_file(tmp_path):
  source = source_of("big_vision_siglip")
  read = big_vision.read(source)
  assert read.text_length == 16
  out = str(tmp_path / "back.npz")
  big_vision.write(out, read.model, read.params)
  with np.load(source) as original, np.load(out) as written:
    assert sorted(written.files) == sorted(original.files)
    for name in original.files:
      np.testing.assert_array_equal(written[name], original[name],
                                    err_msg=name)


@pytest.mark.parametrize("family", [family for family, kind in
                                    FAMILIES.items() if kind != "big_vision"])
def test_a_siglip_model_written_back_is_the_same_file(tmp_path, family):
  source = source_of(family)
  read = siglip.read_two_towers(source)
  assert read.text_length == 16
  siglip.write_two_towers(str(tmp_path), read.model, read.params,
                          FAMILIES[family])
  original = load_file(os.path.join(source, "model.safetensors"))
  written = load_file(str(tmp_path / "model.safetensors"))
  assert sorted(written) == sorted(original)
  for name, value in original.items():
    assert written[name].dtype == value.dtype, name
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  with open(os.path.join(source, "config.json")) as f:
    theirs = json.load(f)
  with open(tmp_path / "config.json") as f:
    ours = json.load(f)
  assert ours["model_type"] == theirs["model_type"] == FAMILIES[family]
  assert ours["architectures"] == theirs["architectures"]
  for tower in ("vision_config", "text_config"):
    shared = set(ours[tower]) & set(theirs[tower])
    assert len(shared) >= 8, shared
    assert {key: ours[tower][key] for key in shared} == {
        key: theirs[tower][key] for key in shared}, tower


def test_a_two_tower_model_of_ours_writes_and_reads_back(tmp_path):
  """Scanned towers (their blocks stacked) and random weights: the
  SiglipModel written computes what the model did."""
  read = siglip.read_two_towers(SOURCE)
  model = read.model.clone(
      config=dataclasses.replace(read.model.config, scan_layers=True),
      text=dataclasses.replace(read.model.text, scan_layers=True))
  images = jnp.zeros((1, 32, 32, 3))
  ids = jnp.zeros((1, 16), jnp.int32)
  params = randomize(nn.meta.unbox(model.init(
      jax.random.key(1), images, ids, train=False)["params"]), seed=3)
  siglip.write_two_towers(str(tmp_path), model, params)
  images, ids, _ = recorded()
  ours = model.apply({"params": params}, images, ids, train=False).logits()
  back = image_text.contrastive_logits(str(tmp_path), images, ids)
  np.testing.assert_allclose(back, ours, rtol=1e-5, atol=1e-5)


def test_a_two_tower_model_without_a_map_head_is_refused(tmp_path):
  read = siglip.read_two_towers(SOURCE)
  model = read.model.clone(config=dataclasses.replace(read.model.config,
                                                      classifier="gap"))
  params = dict(read.params)
  params["img"] = {key: value for key, value in params["img"].items()
                   if key != "MAPHead_0"}
  with pytest.raises(errors.InputError, match="MAP head"):
    siglip.write_two_towers(str(tmp_path), model, params)
