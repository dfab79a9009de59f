"""Checkpoints from and to PyTorch: HF transformers' ViT and timm's.

The files are built here with numpy, in the key names and shapes that
transformers and timm document, so torch stays out of the tests. Logits
are checked against tests/reference_vit.py's float64 forward, which reads
the PyTorch names itself.
"""

import json
import os
from unittest import mock

import flax
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests import reference_vit
from tests.test_finetune import POSEMB, flat, start_of
from tests.util import run_training, small_config
from vit_jax import errors, models
from vit_jax.runs import settings
from vit_jax.runs.workdir import Workdir
from vit_jax.weights import (
  adaptation,
  exports,
  npz as npz_lib,
  pretrained,
)
from vit_jax.weights.pytorch import files

# A model of SMALL's sizes (tests/util.py), trained at 16x16 with 5 classes.
WIDTH, LAYERS, MLP, HEADS, PATCH, SIDE, CLASSES = 32, 2, 64, 4, 2, 16, 5
TOKENS = (SIDE // PATCH) ** 2


def hf_shapes(classifier=True, pooler=False, width=WIDTH, deit=None):
  """transformers' ViT state dict as the hub's files name it: `vit.`
  before the ViTModel inside ViTForImageClassification. `deit`: a DeiT's
  instead, under `deit.`, with its distillation token: "teacher" for
  DeiTForImageClassificationWithTeacher (a head on each token), "plain"
  for DeiTForImageClassification (the class token's only)."""
  vit = ("deit." if deit else "vit.") if classifier else ""
  shapes = {
      f"{vit}embeddings.cls_token": (1, 1, width),
      f"{vit}embeddings.position_embeddings": (1, 1 + bool(deit) + TOKENS,
                                               width),
      f"{vit}embeddings.patch_embeddings.projection.weight":
          (width, 3, PATCH, PATCH),
      f"{vit}embeddings.patch_embeddings.projection.bias": (width,),
      f"{vit}layernorm.weight": (width,), f"{vit}layernorm.bias": (width,),
  }
  for i in range(LAYERS):
    block = f"{vit}encoder.layer.{i}."
    for name, (out, inp) in {
        "attention.attention.query": (width, width),
        "attention.attention.key": (width, width),
        "attention.attention.value": (width, width),
        "attention.output.dense": (width, width),
        "intermediate.dense": (MLP, width),
        "output.dense": (width, MLP)}.items():
      shapes[f"{block}{name}.weight"] = (out, inp)
      shapes[f"{block}{name}.bias"] = (out,)
    for name in ("layernorm_before", "layernorm_after"):
      shapes[f"{block}{name}.weight"] = shapes[f"{block}{name}.bias"] = (
          width,)
  if pooler:
    shapes["pooler.dense.weight"], shapes["pooler.dense.bias"] = (
        (width, width), (width,))
  if deit:
    shapes[f"{vit}embeddings.distillation_token"] = (1, 1, width)
  heads = (("cls_classifier", "distillation_classifier") if deit == "teacher"
           else ("classifier",) if classifier else ())
  for head in heads:
    shapes[f"{head}.weight"], shapes[f"{head}.bias"] = (
        (CLASSES, width), (CLASSES,))
  return shapes


# transformers 5.23's modules have these names, which a state_dict saved
# directly keeps (its save_pretrained writes the hub's).
HF5_NAMES = {
    "encoder.layer.": "layers.",
    "attention.attention.query": "attention.q_proj",
    "attention.attention.key": "attention.k_proj",
    "attention.attention.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2"
}


def to_hf5(tensors):
  renamed = {}
  for key, value in tensors.items():
    for old, new in HF5_NAMES.items():
      key = key.replace(old, new)
    renamed[key] = value
  return renamed


def timm_shapes(width=WIDTH, class_token=True, fc_norm=False,
                no_embed_class=False, pre_logits=False, distilled=False):
  """timm's VisionTransformer state dict; `distilled`: DeiT's
  VisionTransformerDistilled's, with a distillation token and its head."""
  shapes = {
      "pos_embed": (1, TOKENS + (class_token and not no_embed_class)
                    + distilled, width),
      "patch_embed.proj.weight": (width, 3, PATCH, PATCH),
      "patch_embed.proj.bias": (width,),
      "head.weight": (CLASSES, width), "head.bias": (CLASSES,),
  }
  if class_token:
    shapes["cls_token"] = (1, 1, width)
  if distilled:
    shapes["dist_token"] = (1, 1, width)
    shapes["head_dist.weight"], shapes["head_dist.bias"] = (
        (CLASSES, width), (CLASSES,))
  norm = "fc_norm" if fc_norm else "norm"
  shapes[f"{norm}.weight"] = shapes[f"{norm}.bias"] = (width,)
  for i in range(LAYERS):
    block = f"blocks.{i}."
    for name, (out, inp) in {"attn.qkv": (3 * width, width),
                             "attn.proj": (width, width),
                             "mlp.fc1": (MLP, width),
                             "mlp.fc2": (width, MLP)}.items():
      shapes[f"{block}{name}.weight"] = (out, inp)
      shapes[f"{block}{name}.bias"] = (out,)
    for name in ("norm1", "norm2"):
      shapes[f"{block}{name}.weight"] = shapes[f"{block}{name}.bias"] = (
          width,)
  if pre_logits:  # timm before 0.6
    shapes["pre_logits.fc.weight"], shapes["pre_logits.fc.bias"] = (
        (width, width), (width,))
    shapes["head.weight"] = (CLASSES, width)
  return shapes


def random_tensors(shapes, seed=0):
  """float32 values of about the scale of a trained model's."""
  rng = np.random.default_rng(seed)
  tensors = {}
  for key, shape in shapes.items():
    if key.endswith(".weight") and len(shape) == 1:  # LayerNorm scales
      value = 1 + 0.2 * rng.standard_normal(shape)
    elif key.endswith(".weight"):
      value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
      if key in ("head.weight", "head_dist.weight", "classifier.weight",
                 "cls_classifier.weight", "distillation_classifier.weight"):
        value *= 4  # Logits of a few units, as a trained model's.
    else:
      value = 0.2 * rng.standard_normal(shape)
    tensors[key] = value.astype(np.float32)
  return tensors


def hf_config(hidden_act="gelu", layer_norm_eps=1e-12, width=WIDTH, **more):
  return {"model_type": "vit", "architectures": ["ViTForImageClassification"],
          "hidden_size": width, "num_hidden_layers": LAYERS,
          "num_attention_heads": HEADS, "intermediate_size": MLP,
          "hidden_act": hidden_act, "layer_norm_eps": layer_norm_eps,
          "image_size": SIDE, "patch_size": PATCH, "num_channels": 3,
          "qkv_bias": True,
          "id2label": {str(i): f"class {i}" for i in range(CLASSES)}, **more}


def write_hf_dir(directory, tensors, config):
  os.makedirs(directory, exist_ok=True)
  save_file(tensors, os.path.join(directory, "model.safetensors"),
            metadata={"format": "pt"})
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  return str(directory)


def images(n=3):
  return np.random.default_rng(7).uniform(-1, 1, (n, SIDE, SIDE, 3)).astype(
      np.float32)


def logits_of(inference, x):
  model, params = inference
  return np.asarray(jax.jit(lambda p, x: model.apply(
      {"params": p}, x, train=False))(params, x))


def assert_computes_as_torch(inference, tensors, layout, heads, eps, gelu):
  """The model's logits on images() are the float64 reader's of the torch
  state dict `tensors`, logits that say something; returns (images,
  those logits)."""
  x = images()
  expected = reference_vit.forward_torch(tensors, x, layout, heads, eps, gelu)
  assert np.abs(expected).max() > 1
  np.testing.assert_allclose(logits_of(inference, x), expected, rtol=1e-5,
                             atol=1e-5)
  return x, expected


def assert_same_tensors(got, expected):
  assert {k: v.shape for k, v in got.items()} == {
      k: v.shape for k, v in expected.items()}
  for key, value in expected.items():
    assert got[key].dtype == value.dtype, key
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def assert_options_from_headers(source):
  """A run learns `source`'s function and architecture without reading a
  tensor of it (`initial_params` then reads them once), and they are what
  its tensors say."""
  with mock.patch.object(files, "read_safetensors",
                         side_effect=AssertionError("a tensor was read")):
    options = pretrained.source_options(source)
  loaded = pretrained.load(source, HEADS)
  params = flat(loaded.params)
  expected = {**loaded.function, **models.architecture_of(params)}
  posemb = models.posemb_of(params, loaded.function)
  if posemb is not None:  # A table, or RoPE alone, says it.
    expected["posemb"] = posemb
  assert options == expected


@pytest.mark.parametrize("names,hidden_act,eps,gelu", [
    ("hub", "gelu", 1e-12, "exact"),
    ("hub", "gelu_pytorch_tanh", 1e-6, "tanh"),
    ("transformers 5.23", "gelu_new", 1e-5, "tanh"),
])
def test_an_hf_classifier_computes_its_logits_and_writes_back_bitwise(
    tmp_path, names, hidden_act, eps, gelu):
  tensors = random_tensors(hf_shapes())
  stored = to_hf5(tensors) if names != "hub" else tensors
  source = write_hf_dir(tmp_path / "hf", stored,
                        hf_config(hidden_act, eps))
  inference = pretrained.for_inference(source)
  assert_options_from_headers(source)
  config = inference.model.config
  assert (config.layer_norm_epsilon, config.gelu, config.num_heads,
          config.classifier, inference.image_size) == (eps, gelu, HEADS,
                                                       "token", SIDE)
  assert inference.class_names == [f"class {i}" for i in range(CLASSES)]

  assert_computes_as_torch(inference, tensors, "hf", HEADS, eps, gelu)

  out = str(tmp_path / "out")
  exports.write(pretrained.load(source), "hf", out)
  # Written in the hub's names, which transformers 4 and 5 both load.
  assert_same_tensors(load_file(os.path.join(out, "model.safetensors")),
                      tensors)
  with open(os.path.join(out, "config.json")) as f:
    written = json.load(f)
  expected_act = {"exact": "gelu", "tanh": "gelu_pytorch_tanh"}[gelu]
  assert {key: written[key] for key in hf_config()} == {
      **hf_config(expected_act, eps), "architectures":
      ["ViTForImageClassification"]}
  assert written["label2id"]["class 3"] == 3


@pytest.mark.parametrize("deit", ["teacher", "plain"])
def test_an_hf_deit_reads_with_its_distillation_token(tmp_path, deit):
  """DeiTForImageClassificationWithTeacher is a model with a distillation
  token (its two heads averaged), written back as timm's distilled DeiT;
  DeiTForImageClassification's classifier reads the class token alone,
  and its distillation token is a register. Both take ImageNet's mean and
  std, DeiT's image processor's."""
  tensors = random_tensors(hf_shapes(deit=deit))
  source = write_hf_dir(tmp_path / "hf", tensors, hf_config(
      model_type="deit", architectures=["DeiTForImageClassification"]))
  inference = pretrained.for_inference(source, HEADS)
  assert_options_from_headers(source)
  config = inference.model.config
  assert (config.distill_token, config.num_registers) == (
      (True, 0) if deit == "teacher" else (False, 1))
  assert pretrained.load(source).normalization.mean == (
      files.IMAGENET.mean)
  x, expected = assert_computes_as_torch(inference, tensors, "hf", HEADS,
                                         1e-12, "exact")
  if deit == "teacher":
    out = str(tmp_path / "deit.safetensors")
    exports.write(pretrained.load(source), "timm", out)
    np.testing.assert_allclose(reference_vit.forward_torch(
        load_file(out), x, "timm", HEADS, 1e-12, "exact"), expected,
                               rtol=1e-9, atol=1e-9)


def test_an_hf_config_without_qkv_bias_reads_as_zero_biases(tmp_path):
  tensors = {key: value for key, value in random_tensors(hf_shapes()).items()
             if not (key.endswith(".bias") and ".attention.attention." in key)}
  source = write_hf_dir(tmp_path / "hf", tensors, hf_config(qkv_bias=False))
  x = images()
  expected = reference_vit.forward_torch(
      {**tensors, **{key[:-6] + "bias": np.zeros(WIDTH, np.float32)
                     for key in tensors if ".attention.attention." in key}},
      x, "hf", HEADS, 1e-12, "exact")
  np.testing.assert_allclose(logits_of(pretrained.for_inference(source), x),
                             expected, rtol=1e-5, atol=1e-5)


TIMM_CASES = {
    "class token, a paper width": dict(width=192),
    "average pool, fc_norm": dict(class_token=False, fc_norm=True),
    "average pool, norm on tokens": dict(class_token=False),
    "no_embed_class": dict(no_embed_class=True),
    "pre-logits (timm < 0.6)": dict(pre_logits=True),
    "DeiT distilled": dict(distilled=True),
}


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_a_timm_file_computes_its_logits_and_writes_back_bitwise(
    tmp_path, case):
  options = TIMM_CASES[case]
  width = options.get("width", WIDTH)
  heads = 3 if width == 192 else HEADS  # Ti's, read from the width.
  tensors = random_tensors(timm_shapes(**options))
  path = str(tmp_path / "timm.safetensors")
  save_file(tensors, path)
  inference = pretrained.for_inference(
      path, num_heads=None if width == 192 else HEADS)
  if width != 192:
    assert_options_from_headers(path)
  config = inference.model.config
  assert (config.layer_norm_epsilon, config.gelu, config.num_heads) == (
      1e-6, "exact", heads)
  assert config.classifier == ("token" if options.get("class_token", True)
                               else "gap")
  assert config.final_norm == ("pooled" if options.get("fc_norm") else
                               "tokens")
  assert config.distill_token == options.get("distilled", False)

  assert_computes_as_torch(inference, tensors, "timm", heads, 1e-6, "exact")

  out = str(tmp_path / "out.safetensors")
  if options.get("pre_logits"):  # timm's VisionTransformer has none now.
    with pytest.raises(errors.InputError, match="pre-logits"):
      exports.write(pretrained.load(path, HEADS), "timm", out)
    return
  how = exports.write(pretrained.load(path, heads), "timm", out)
  written = load_file(out)
  if options.get("no_embed_class"):  # Read as a zero class-token row.
    tensors["pos_embed"] = np.concatenate(
        [np.zeros((1, 1, width), np.float32), tensors["pos_embed"]], axis=1)
  assert_same_tensors(written, tensors)
  assert f"num_heads={heads}" in how and "load_state_dict" in how
  assert ("deit.VisionTransformerDistilled(" in how) == options.get(
      "distilled", False)


def test_a_timm_width_of_no_variant_needs_its_head_count(tmp_path):
  path = str(tmp_path / "timm.safetensors")
  save_file(random_tensors(timm_shapes()), path)
  with pytest.raises(errors.InputError, match="--num_heads"):
    pretrained.for_inference(path)


def test_a_model_loaded_from_npz_exports_to_both_layouts_and_back(tmp_path):
  """Our own function (tanh GELU) survives the trip through both layouts:
  the HF config names it, and timm's lines pass it."""
  tensors = random_tensors(hf_shapes())
  source = write_hf_dir(tmp_path / "hf", tensors,
                        hf_config("gelu_pytorch_tanh", 1e-6))
  npz = str(tmp_path / "release.npz")
  exports.write(pretrained.load(source), "npz", npz)
  inference = pretrained.for_inference(npz)
  # The release's function, which the file computes.
  config = inference.model.config
  assert (config.gelu, config.layer_norm_epsilon) == ("tanh", 1e-6)
  x = images()
  want = logits_of(inference, x)
  exports.write(pretrained.load(npz), "hf", str(tmp_path / "hf2"))
  exports.write(pretrained.load(npz), "timm", str(tmp_path / "t.safetensors"))
  again = pretrained.for_inference(str(tmp_path / "hf2"))
  np.testing.assert_array_equal(logits_of(again, x), want)
  timm = load_file(str(tmp_path / "t.safetensors"))
  np.testing.assert_allclose(reference_vit.forward_torch(
      timm, x, "timm", HEADS, 1e-6, "tanh"), want, rtol=1e-5, atol=1e-5)


def test_what_the_pytorch_layouts_cannot_hold_is_refused(tmp_path):
  npz = str(tmp_path / "gap.npz")
  source = write_hf_dir(tmp_path / "hf", random_tensors(hf_shapes()),
                        hf_config())
  inference = pretrained.for_inference(source)
  flat_params = flat(inference.params)
  del flat_params["cls"]
  flat_params[POSEMB] = flat_params[POSEMB][:, 1:]
  npz_lib.save_npz(flax.traverse_util.unflatten_dict(
      flat_params, sep="/"), npz)
  with pytest.raises(errors.InputError, match="no class token"):
    exports.write(pretrained.load(npz), "hf", str(tmp_path / "o"))


def test_todays_options_are_refused_by_name_on_hf_export(tmp_path):
  """HF's ViT has no place for them (timm's has: test_todays_checkpoints)."""
  model = models.create("Ti/4", num_classes=3, classifier="map",
                        num_registers=2, layer_scale=0.1, qk_norm=True,
                        num_layers=1, hidden_size=16, mlp_dim=32, num_heads=2)
  params = model.init(jax.random.key(0), np.zeros((1, 8, 8, 3), np.float32),
                      train=False)["params"]
  npz = str(tmp_path / "today.npz")
  npz_lib.save_npz(params, npz)
  with pytest.raises(errors.InputError) as error:
    exports.write(pretrained.load(npz), "hf", str(tmp_path / "o"))
  for part in ("attention pooling", "layer scale", "register tokens",
               "query/key norms"):
    assert part in str(error.value)
  assert str(error.value).count("--format=timm writes it") == 4


def test_an_export_renamed_like_a_pickle_is_named_by_its_content(tmp_path):
  """It was called "a PyTorch pickle"."""
  model = models.create("Ti/2", 10, hidden_size=16, num_layers=1, mlp_dim=32,
                        num_heads=2)
  params = model.init(jax.random.key(0), np.zeros((1, 8, 8, 3), np.float32),
                      train=False)["params"]
  npz_file = tmp_path / "model.npz"
  npz_lib.save_npz(params, str(npz_file))
  loaded = pretrained.load(str(npz_file))
  exports.write(loaded, "timm", str(tmp_path / "model.safetensors"))
  exports.write(loaded, "stablehlo", str(tmp_path / "model.stablehlo"))
  for suffix in (".npz", ".safetensors", ".stablehlo"):
    renamed = tmp_path / f"renamed{suffix}.bin"
    renamed.write_bytes((tmp_path / f"model{suffix}").read_bytes())
    with pytest.raises(errors.InputError) as raised:
      pretrained.load(str(renamed))
    assert str(raised.value) == (
        f"{renamed} is, by its content, a vit_jax export ({suffix}) named "
        f"like a PyTorch pickle: rename it to end in {suffix}")


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pth",
                                  "weights.pt"])
def test_pytorch_pickles_are_refused_with_the_conversion(tmp_path, name):
  path = tmp_path / name
  path.write_bytes(b"\x80\x02not to be unpickled")
  for load in (pretrained.load, pretrained.for_inference):
    with pytest.raises(errors.InputError, match="never loads") as raised:
      load(str(path))
    assert "safetensors.torch.save_file" in str(raised.value)
  directory = tmp_path / "hf"
  directory.mkdir()
  (directory / "config.json").write_text(json.dumps(hf_config()))
  (directory / "pytorch_model.bin").write_bytes(b"\x80\x02")
  with pytest.raises(errors.InputError, match="save_pretrained"):
    pretrained.load(str(directory))


def test_init_from_an_hf_model_at_a_new_resolution_and_class_count(
    digits_data_dir, tmp_path):
  """A ViTModel (its pooler the pre-logits layer, no head) fine-tunes on
  digits at 8x8 with 10 classes: position embeddings interpolated from
  16x16, pre-logits dropped, a new head; the run computes and records the
  HF function."""
  tensors = random_tensors(hf_shapes(classifier=False, pooler=True))
  source = write_hf_dir(tmp_path / "hf", tensors, hf_config())
  with pytest.raises(errors.InputError, match="no classification head"):
    pretrained.for_inference(source)
  config = pretrained.with_source(
      settings.of(small_config(digits_data_dir, init_from=source)))
  assert (config.model.layer_norm_epsilon, config.model.gelu) == (1e-12,
                                                                  "exact")
  state, program = start_of(config)
  assert (program.model.config.layer_norm_epsilon,
          program.model.config.gelu) == (1e-12, "exact")
  started, loaded = flat(state.params), flat(pretrained.load(source).params)
  assert "pre_logits/kernel" in loaded and "pre_logits/kernel" not in started
  assert started[POSEMB].shape == (1, 17, WIDTH)
  np.testing.assert_array_equal(started[POSEMB], adaptation.resize_posemb(
      loaded[POSEMB], (1, 17, WIDTH), num_extra=1))
  assert started["head/kernel"].shape == (WIDTH, 10)
  assert not started["head/kernel"].any()
  query = "Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/"
  np.testing.assert_array_equal(
      started[query + "kernel"],
      tensors["encoder.layer.1.attention.attention.query.weight"].T.reshape(
          WIDTH, HEADS, WIDTH // HEADS))

  workdir = str(tmp_path / "run")
  run_training(small_config(
      digits_data_dir, init_from=source, total_steps=2, log_every=1,
      checkpoint_every=2, **{"evaluators.test.every": 0,
                             "optimizer.warmup_steps": 1}), workdir)
  recorded = Workdir(workdir).read_config().model
  assert (recorded.layer_norm_epsilon, recorded.gelu,
          recorded.final_norm) == (1e-12, "exact", "tokens")
  inference = pretrained.for_inference(workdir)
  assert (inference.model.config.layer_norm_epsilon,
          inference.model.config.gelu) == (1e-12, "exact")
  # Exported, the fine-tune names the digits' classes and its function.
  exports.write(pretrained.load(workdir), "hf", str(tmp_path / "out"))
  with open(tmp_path / "out" / "config.json") as f:
    written = json.load(f)
  assert written["id2label"] == {str(i): str(i) for i in range(10)}
  assert (written["hidden_act"], written["layer_norm_eps"]) == ("gelu", 1e-12)


def test_init_from_a_timm_file_at_a_new_resolution_and_class_count(
    digits_data_dir, tmp_path):
  """An average-pool timm model with fc_norm: the fine-tune keeps fc_norm
  (final_norm "pooled") and the exact GELU."""
  tensors = random_tensors(timm_shapes(class_token=False, fc_norm=True))
  path = str(tmp_path / "timm.safetensors")
  save_file(tensors, path)
  config = pretrained.with_source(settings.of(small_config(
      digits_data_dir, init_from=path, **{"model.classifier": "gap"})))
  assert (config.model.gelu, config.model.final_norm) == ("exact", "pooled")
  state, program = start_of(config)
  assert program.model.config.final_norm == "pooled"
  started = flat(state.params)
  assert started[POSEMB].shape == (1, 16, WIDTH)
  np.testing.assert_array_equal(started[POSEMB], adaptation.resize_posemb(
      flat(pretrained.load(path, HEADS).params)[POSEMB], (1, 16, WIDTH),
      num_extra=0))
  np.testing.assert_array_equal(started["fc_norm/scale"],
                                tensors["fc_norm.weight"])
  assert "Transformer/encoder_norm/scale" not in started
  assert started["head/kernel"].shape == (WIDTH, 10)
  assert not started["head/kernel"].any()


def test_init_from_a_distilled_deit_keeps_its_token_and_starts_both_heads(
    digits_data_dir, tmp_path):
  """A fine-tune of timm's distilled DeiT takes its distillation token
  from the file; the position table is resized past both tokens' rows,
  and both heads start afresh for the new classes."""
  tensors = random_tensors(timm_shapes(distilled=True))
  path = str(tmp_path / "deit.safetensors")
  save_file(tensors, path)
  config = pretrained.with_source(settings.of(small_config(
      digits_data_dir, init_from=path)))
  assert config.model.distill_token
  state, _ = start_of(config)
  started = flat(state.params)
  np.testing.assert_array_equal(started["dist"], tensors["dist_token"])
  assert started[POSEMB].shape == (1, 2 + 16, WIDTH)
  np.testing.assert_array_equal(started[POSEMB], adaptation.resize_posemb(
      tensors["pos_embed"], (1, 18, WIDTH), num_extra=2))
  for head in ("head", "head_dist"):
    assert started[f"{head}/kernel"].shape == (WIDTH, 10)
    assert not started[f"{head}/kernel"].any()


def test_an_imagenet_normalised_model_folded_takes_our_images(tmp_path):
  """export --input_mean/--input_std: the folded model on images in
  [-1, 1] computes what the source computes on its own normalisation."""
  tensors = random_tensors(timm_shapes())
  path = str(tmp_path / "timm.safetensors")
  save_file(tensors, path)
  mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  folded = pretrained.inference_of(exports.fold_input_normalization(
      pretrained.load(path, HEADS), mean, std))
  x = images()
  theirs = ((x + 1) / 2 - np.asarray(mean)) / np.asarray(std)
  np.testing.assert_allclose(
      logits_of(folded, x), reference_vit.forward_torch(
          tensors, theirs, "timm", HEADS, 1e-6, "exact"), rtol=1e-5, atol=1e-5)
  with pytest.raises(errors.InputError, match="3 values"):
    exports.fold_input_normalization(pretrained.load(path, HEADS), (0.5,),
                                     (0.5,))


def test_sharded_hf_weights_are_read_through_their_index(tmp_path):
  tensors = random_tensors(hf_shapes())
  directory = tmp_path / "hf"
  write_hf_dir(directory, {}, hf_config())
  os.remove(directory / "model.safetensors")
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  for shard, keys in shards.items():
    save_file({key: tensors[key] for key in keys}, str(directory / shard),
              metadata={"format": "pt"})
  (directory / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {key: shard for shard, keys in shards.items()
                      for key in keys}}))
  assert_options_from_headers(str(directory))
  x = images()
  np.testing.assert_allclose(
      logits_of(pretrained.for_inference(str(directory)), x),
      reference_vit.forward_torch(tensors, x, "hf", HEADS, 1e-12, "exact"),
      rtol=1e-5, atol=1e-5)


def test_parts_a_plain_vit_lacks_are_refused_by_name(tmp_path):
  tensors = random_tensors(timm_shapes())
  # timm's scale_mlp_norm: a LayerNorm inside the MLP.
  tensors["blocks.0.mlp.norm.weight"] = np.ones(MLP, np.float32)
  tensors["blocks.0.mlp.norm.bias"] = np.zeros(MLP, np.float32)
  path = str(tmp_path / "timm.safetensors")
  save_file(tensors, path)
  with pytest.raises(errors.InputError, match="blocks.0.mlp.norm.weight"):
    pretrained.load(path, HEADS)
