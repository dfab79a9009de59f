"""vit_jax against outputs recorded from the real libraries.

tests/fixtures/libraries/ holds, for every family of PyTorch-world ViT that
vit_jax reads or writes, a small random model saved as its own library
saves it, fixed inputs, and that library's outputs on them (its README.md
says what each file is). They were recorded by
benchmarks/record_libraries.py with torch 2.14.1, torchvision 0.29.1,
timm 1.0.31 and transformers 5.24.0 (versions.json), each model in float64
(float32 weights, `model.double()`); the release's .npz families by
google-research/vision_transformer's own models_vit.py (commit c6de1e5)
under jax 0.10.2 and flax 0.12.8, in float32, its dtype. Re-record, in a
virtual environment with torch, timm and transformers (never the
project's; torch is no dependency of the package or its tests):

  /work/torchvenv/bin/python benchmarks/record_libraries.py \
      --out=tests/fixtures/libraries \
      --vision_transformer=CHECKOUT_OF_google-research/vision_transformer

Each family is read here through vit_jax's public readers
(`pretrained.for_inference`), run on the recorded inputs in float32, and
compared with the recorded logits, pooled features (what the head reads)
and patch tokens (the last hidden state, patches only); then written back
with `exports.write` in the format the docs say (docs/pytorch.md), the
written tensors compared with the file's own where the docs say it is "the
very same file" (bitwise), and the written model read again and compared
with the recorded outputs. SigLIP 2's NaFlex patches of the recorded
pictures are compared with both of transformers' image processors'
(docs/naflex.md). No torch here: numpy, safetensors and vit_jax.

tests/reference_vit.py stays: it checks what no recorded library has
(parts the libraries lack, refusals, the fine-tunes).
"""

import dataclasses
import json
import os

import flax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.test_mae_interchange import FAMILIES as MAE_FAMILIES
from tests.test_siglip_interchange import FAMILIES as TWO_TOWER_FAMILIES
from vit_jax import errors
from vit_jax.data import image_files
from vit_jax.models import naflex
from vit_jax.weights import exports, pretrained

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "libraries")


@dataclasses.dataclass(frozen=True)
class Family:
  """How a recorded family is read and written back.

  tolerance: the largest difference allowed, relative to the largest
    recorded value of each output: float32 here against the library's
    float64 (the release's: float32 both) leaves about 1e-6; measured at
    5e-7 to 1.2e-6 (docs/pytorch.md, "Proof against the libraries").
  write: the format `exports.write` gives it back in (None: none holds it;
    `refused`: the message that says why).
  same_file: the written tensors are the file's own, bitwise (the docs'
    "the very same file"); `renamed` maps the written names to the
    file's, `unwritten` names the file's tensors that inference does not
    read and the writer fills (DINOv3's mask token).
  """
  source: str  # in the family's folder
  write: str | None = None
  same_file: bool = False
  renamed: tuple = ()  # (written prefix, the file's prefix)
  unwritten: tuple = ()
  refused: str = ""


TOLERANCE = 1e-5
FAMILIES = {
    # timm VisionTransformer, class-token pooled: written back, the same
    # file.
    "timm_vit_token": Family("model.safetensors", "timm", same_file=True),
    # 4 registers, layer scale, attention pooling, query/key norms: its
    # class token, unpooled, becomes a register, and the registers' rows
    # of the position table are folded into them, so the written file
    # differs but computes the same.
    "timm_vit_map_registers_layerscale_qknorm": Family("model.safetensors",
                                                       "timm"),
    # 2 registers, average pooling with fc_norm, no_embed_class: likewise.
    "timm_vit_avg_fcnorm_registers_no_embed_class": Family(
        "model.safetensors", "timm"),
    # DeiT's VisionTransformerDistilled: the same file.
    "timm_deit_distilled": Family("model.safetensors", "timm",
                                  same_file=True),
    # timm's RoPE ViTs (Eva): "cat" RoPE (rope "index"), learned "mixed"
    # frequencies, and "cat" with a position table (ape): the same file.
    "timm_eva_rope_index": Family("model.safetensors", "timm",
                                  same_file=True),
    "timm_eva_rope_mixed": Family("model.safetensors", "timm",
                                  same_file=True),
    "timm_eva_rope_ape": Family("model.safetensors", "timm", same_file=True),
    # timm's DINOv3 ports (Eva): query and value biases; a SwiGLU MLP.
    "timm_eva_dinov3_qkvb": Family("model.safetensors", "timm",
                                   same_file=True),
    "timm_eva_dinov3_swiglu": Family("model.safetensors", "timm",
                                     same_file=True),
    # MAE's pre-trained encoder ("vit_base_patch16_224.mae", num_classes=0):
    # no head, so no logits; its features (model(x), the class token after
    # the final norm) and patch tokens are compared. Written back as a
    # headless timm model (as a self-distilled teacher is), the same file.
    "timm_vit_mae_encoder": Family("model.safetensors", "timm",
                                   same_file=True),
    # transformers: save_pretrained writes the hub's names, which vit_jax
    # writes back.
    "hf_vit_classifier": Family("hf", "hf", same_file=True),
    # A ViTModel's pooler is a pre-logits layer, which neither layout
    # holds today.
    "hf_vit_model_pooler": Family("hf", "hf", refused="pre-logits layer"),
    # DeiTForImageClassificationWithTeacher: written back as timm's
    # distilled DeiT (docs/pytorch.md), so no same file.
    "hf_deit_with_teacher": Family("hf", "timm"),
    # DINOv2s, headless, go to timm as headless VisionTransformers (their
    # layer scales as timm's; the [mask] token, which inference does not
    # read, left out).
    "hf_dinov2": Family("hf", "timm"),
    "hf_dinov2_registers": Family("hf", "timm"),
    # DINOv2-g's SwiGLU MLP (use_swiglu_ffn): the hub's fused weights_in.
    # timm's VisionTransformer holds it only packed (SwiGLUPacked), which
    # its layout does not write; a self-distilled run's goes out as a
    # Dinov2Model (tests/test_dino.py).
    "hf_dinov2_swiglu": Family("hf", "timm", refused="SwiGLU"),
    # DINOv3ViTModel: written back in the hub's names; its mask token
    # (pre-training's) is written as zeros.
    "hf_dinov3": Family("hf", "hf", same_file=True,
                        unwritten=("embeddings.mask_token",)),
    # SiglipVisionModel: written back as a Siglip2VisionModel, whose patch
    # embedding is a Linear.
    "hf_siglip": Family("hf", "hf"),
    # Siglip2VisionModel, saved by transformers 5.24 without the hub's
    # "vision_model." prefix, which vit_jax writes.
    "hf_siglip2_naflex": Family("hf", "hf", same_file=True,
                                renamed=(("vision_model.", ""),)),
    # The release's .npz, made by google-research/vision_transformer's
    # models_vit.py under today's flax (its module names: LayerNorm_1,
    # MlpBlock_0, MultiHeadDotProductAttention_0; the released files have
    # the older LayerNorm_2, MlpBlock_3, MultiHeadDotProductAttention_1,
    # which vit_jax writes): read back, the same params.
    "release_token_pre_logits": Family("model.npz", "npz"),
    "release_gap": Family("model.npz", "npz"),
}


def folder(family):
  return os.path.join(FIXTURES, family)


def recorded(family):
  """(model.json, inputs, outputs) of a recorded family."""
  with open(os.path.join(folder(family), "model.json")) as f:
    meta = json.load(f)
  return (meta, load_file(os.path.join(folder(family), "inputs.safetensors")),
          load_file(os.path.join(folder(family), "outputs.safetensors")))


def relative(got, expected):
  """The largest difference relative to the largest expected value, of
  outputs that say something (the recorded ones are of 1 to 6 units)."""
  expected = np.asarray(expected, np.float64)
  assert np.abs(expected).max() > 0.5
  return float(np.abs(np.asarray(got, np.float64) - expected).max() /
               np.abs(expected).max())


def computed(inference, x):
  """(logits, features, encoded tokens) of vit_jax's model on `x`: the
  tokens as its encoder ("Transformer") gives them, prefix tokens first."""
  model, params = inference
  logits, state = model.apply(
      {"params": params}, x, train=False, mutable=["intermediates"],
      capture_intermediates=lambda module, method: (
          module.name == "Transformer" and method == "__call__"))
  found = flax.traverse_util.flatten_dict(state["intermediates"], sep="/")
  (tokens,) = [value[0] for key, value in found.items()
               if key.endswith("Transformer/__call__")]
  (features,) = [value[0] for key, value in found.items()
                 if key == "features" or key.endswith("/features")]
  return np.asarray(logits), np.asarray(features), np.asarray(tokens)


def inputs_of(inputs, shape):
  """The recorded input `shape` as vit_jax takes it: images NHWC in
  [-1, 1], or SigLIP 2's processed patches as a NaFlex batch."""
  if shape == "naflex":
    return naflex.Patches(inputs["torchvision/pixel_values"],
                          inputs["torchvision/spatial_shapes"])
  return inputs[shape]


def assert_computes_as_recorded(inference, family):
  """Logits, features and patch tokens within the family's tolerance on
  every recorded input; returns {output: relative difference}."""
  _, inputs, outputs = recorded(family)
  found = {}
  for shape in sorted({key.split("/")[0] for key in outputs}):
    logits, features, tokens = computed(inference, inputs_of(inputs, shape))
    patches = outputs[f"{shape}/patch_tokens"]
    ours = tokens[:, tokens.shape[1] - patches.shape[1]:]  # Patches last.
    if shape == "naflex":  # The real patches; padding is no output.
      real = inputs["torchvision/pixel_attention_mask"].astype(bool)
      ours, patches = ours[real], patches[real]
    found[f"{shape}/patch_tokens"] = relative(ours, patches)
    found[f"{shape}/features"] = relative(features,
                                          outputs[f"{shape}/features"])
    if f"{shape}/logits" in outputs:
      found[f"{shape}/logits"] = relative(logits, outputs[f"{shape}/logits"])
  for output, difference in found.items():
    assert difference < TOLERANCE, (family, output, found)
  return found


def _flat(params):
  return flax.traverse_util.flatten_dict(params, sep="/")


def _file_tensors(family, source):
  if source.endswith(".safetensors"):
    return load_file(source)
  if source.endswith(".npz"):
    with np.load(source) as arrays:
      return dict(arrays)
  return load_file(os.path.join(source, "model.safetensors"))


def assert_same_file(family, spec, written):
  """The written tensors are the file's own, bitwise (names renamed,
  `unwritten` ones left out of the comparison)."""
  original = _file_tensors(family, os.path.join(folder(family), spec.source))
  renamed = {}
  for name, value in written.items():
    for prefix, theirs in spec.renamed:
      if name.startswith(prefix):
        name = theirs + name[len(prefix):]
    renamed[name] = value
  assert sorted(renamed) == sorted(original)
  for name, value in original.items():
    if name in spec.unwritten:
      continue
    assert renamed[name].dtype == value.dtype, name
    np.testing.assert_array_equal(renamed[name], value, err_msg=name)


# What a written config.json says as the library's own did, where both say
# it.
HF_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "patch_size", "image_size",
                  "num_patches", "layer_norm_eps", "hidden_act",
                  "num_register_tokens", "rope_theta", "key_bias")
TIMM_ARGUMENTS = ("patch_size", "embed_dim", "depth", "num_heads",
                  "num_classes")


def assert_built_alike(family, meta, how, out):
  """The written model is built as the recorded one was: timm's printed
  lines pass model.json's sizes; an HF config.json says what the
  library's said."""
  if out.endswith(".safetensors") and meta["library"] == "timm":
    for key in TIMM_ARGUMENTS:
      assert f"{key}={meta['kwargs'][key]!r}" in how, (key, how)
  if not os.path.isdir(out):
    return
  with open(os.path.join(folder(family), "hf", "config.json")) as f:
    theirs = json.load(f)
  with open(os.path.join(out, "config.json")) as f:
    ours = json.load(f)
  shared = [key for key in HF_CONFIG_KEYS if key in theirs and key in ours]
  assert len(shared) >= 6, shared
  assert {key: ours[key] for key in shared} == {
      key: theirs[key] for key in shared}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_recorded_family_computes_as_its_library_and_writes_back(
    tmp_path, family):
  spec = FAMILIES[family]
  meta, _, _ = recorded(family)
  source = os.path.join(folder(family), spec.source)
  inference = pretrained.for_inference(source, num_heads=meta["num_heads"],
                                       features=True)
  assert inference.model.config.num_heads == meta["num_heads"]
  assert_computes_as_recorded(inference, family)
  if spec.write is None:
    return
  loaded = pretrained.load(source, meta["num_heads"])
  out = str(tmp_path / ("back" + exports.SUFFIXES.get(spec.write, "")))
  if spec.refused:
    with pytest.raises(errors.InputError, match=spec.refused):
      exports.write(loaded, spec.write, out)
    return
  how = exports.write(loaded, spec.write, out)
  assert_built_alike(family, meta, how, out)
  if spec.same_file:
    assert_same_file(family, spec, _file_tensors(family, out))
  back = pretrained.load(out, meta["num_heads"])
  if spec.write == "npz":  # The release's names: the same params.
    assert _flat(back.params).keys() == _flat(loaded.params).keys()
    for key, value in _flat(loaded.params).items():
      np.testing.assert_array_equal(_flat(back.params)[key], value,
                                    err_msg=key)
  assert_computes_as_recorded(pretrained.for_inference(
      out, num_heads=meta["num_heads"], features=True), family)


def test_every_recorded_family_is_tested():
  recorded_families = sorted(
      name for name in os.listdir(FIXTURES)
      if os.path.isdir(os.path.join(FIXTURES, name)))
  # transformers' masked autoencoders and two-tower SigLIP are checked by
  # tests/test_mae_interchange.py and tests/test_siglip_interchange.py:
  # no classifier's reader runs them.
  assert recorded_families == sorted([*FAMILIES, *MAE_FAMILIES,
                                      *TWO_TOWER_FAMILIES])
  with open(os.path.join(FIXTURES, "versions.json")) as f:
    versions = json.load(f)
  for library in ("torch", "timm", "transformers", "numpy", "python",
                  "google-research/vision_transformer"):
    assert versions.get(library), library


# One grey level of uint8 pixels, in the processors' [-1, 1].
GREY_LEVEL = 2 / 255


@pytest.mark.parametrize("processor", ["pil", "torchvision"])
def test_naflex_patches_of_pictures_are_siglip2_processors(processor):
  """vit_jax's NaFlex patches of the recorded pictures (predict's reading
  of image files, image_files.naflex_from_files) against transformers'
  Siglip2ImageProcessorPil and Siglip2ImageProcessor (torchvision): the
  same grids and padding, and the real patches' pixels within one grey
  level (docs/naflex.md)."""
  family = "hf_siglip2_naflex"
  _, inputs, _ = recorded(family)
  with open(os.path.join(folder(family), "pictures.json")) as f:
    pictures = json.load(f)
  files = [os.path.join(folder(family), f"picture_{name}.png")
           for name in pictures["pictures"]]
  batch = image_files.naflex_from_files(files, naflex.Budget(
      pictures["patch_size"], pictures["max_num_patches"]))
  np.testing.assert_array_equal(batch.grid,
                                inputs[f"{processor}/spatial_shapes"])
  real = inputs[f"{processor}/pixel_attention_mask"].astype(bool)
  np.testing.assert_array_equal(
      np.arange(real.shape[1]) < batch.grid.prod(1)[:, None], real)
  ours = batch.pixels.astype(np.float64) / 127.5 - 1
  theirs = inputs[f"{processor}/pixel_values"]
  assert ours.shape == theirs.shape
  assert np.abs(ours[real] - theirs[real]).max() <= GREY_LEVEL + 1e-6
