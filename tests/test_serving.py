"""Exports that run without vit_jax: a digits run as StableHLO, run by
vit_jax/serving.py in a process that cannot import vit_jax, and by
`predict --from`; as ONNX, run by ONNX Runtime; SigLIP- and DINOv2-shaped
towers in both; the loader's resize against evaluation's."""

import dataclasses
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime
import pytest

from tests import test_todays_checkpoints as todays
from tests.test_torch_interchange import random_tensors, write_hf_dir
from tests.util import REPO, call_tool, made_once, run_tool
from vit_jax import errors, serving
from vit_jax.analysis import classify
from vit_jax.data import image_files, preprocess
from vit_jax.weights import exports, function_exports, pretrained

BATCHES = (1, 3, 64)

# In a fresh interpreter where `import vit_jax` fails: serving.py loaded
# from its file, as a server that has only it, JAX and numpy would.
OUTSIDE = r"""
import importlib.util, sys
import numpy as np
sys.modules["vit_jax"] = None  # Any import of vit_jax now fails.
try:
  import vit_jax.serving
  raise SystemExit("vit_jax was importable")
except ImportError:
  pass
spec = importlib.util.spec_from_file_location("serving", sys.argv[1])
serving = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serving)
model = serving.load(sys.argv[2])
pixels = np.load(sys.argv[3])
out = {}
for batch in map(int, sys.argv[5:]):
  out[f"probabilities_{batch}"] = model.probabilities(pixels[:batch])
  out[f"pre_logits_{batch}"] = model(pixels[:batch])["pre_logits"]
np.savez(sys.argv[4], names=np.array(model.class_names),
         modules=np.array(sorted(name for name, module in sys.modules.items()
                                 if name.startswith("vit_jax") and module)),
         **out)
"""


@pytest.fixture(scope="module")
def digits_export(digits_run, tmp_path_factory):
  """(inference, 64 test images as pixels, predict's probabilities, the
  StableHLO file, the run's PNGs) of the digits run."""
  workdir, pngs, _, _ = digits_run

  def make(directory):
    stdout = run_tool("export", f"--workdir={workdir}", "--format=stablehlo",
                      f"--out={directory}/digits.stablehlo")
    assert "serving.load" in stdout

  out = os.path.join(made_once(tmp_path_factory, "digits_stablehlo", make),
                     "digits.stablehlo")
  inference = pretrained.for_inference(workdir)
  files = image_files.expand([pngs])[:max(BATCHES)]
  pixels = image_files.from_files(files, inference.image_size,
                                  inference.crop_fraction)
  return (inference, pixels, classify.probabilities(inference, pixels), out,
          pngs)


def test_a_digits_run_runs_from_its_stablehlo_without_vit_jax(
    digits_export, tmp_path):
  inference, pixels, expected, out, _ = digits_export
  assert expected.max(axis=-1).mean() > 0.5  # A model that says something.
  np.save(tmp_path / "pixels.npy", pixels)
  subprocess.run(
      [sys.executable, "-c", OUTSIDE, os.path.join(REPO, "vit_jax",
                                                   "serving.py"),
       out, str(tmp_path / "pixels.npy"), str(tmp_path / "out.npz"),
       *map(str, BATCHES)], cwd=tmp_path, check=True, timeout=300)
  got = np.load(tmp_path / "out.npz")
  assert got["modules"].size == 0
  assert list(got["names"]) == [str(d) for d in range(10)]
  features = inference.model.apply({"params": inference.params}, pixels,
                                   train=False, mutable=["intermediates"])[1]
  for batch in BATCHES:
    np.testing.assert_allclose(got[f"probabilities_{batch}"],
                               expected[:batch], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got[f"pre_logits_{batch}"],
                               features["intermediates"]["features"][0][
                                   :batch], rtol=1e-5, atol=1e-5)


def test_predict_runs_a_stablehlo_export_as_it_runs_the_run(digits_export):
  inference, _, _, out, pngs = digits_export
  rows = [json.loads(line) for line in run_tool(
      "predict", f"--from={out}", pngs, "--json", "--top=2").splitlines()]
  files = image_files.expand([pngs])
  expected = classify.top_classes(classify.probabilities(
      inference, image_files.from_files(files, inference.image_size,
                                        inference.crop_fraction)), 2)
  assert [row["image"] for row in rows] == files
  for row, top in zip(rows, expected):
    assert [entry["class"] for entry in row["top"]] == [c for c, _, _ in top]
    np.testing.assert_allclose([entry["probability"] for entry in row["top"]],
                               [p for _, _, p in top], atol=1e-5)
    assert row["top"][0]["name"] == str(row["top"][0]["class"])


def test_a_digits_run_runs_from_its_onnx_in_onnx_runtime(digits_export,
                                                         tmp_path):
  inference, pixels, expected, _, _ = digits_export
  out = tmp_path / "digits.onnx"
  function_exports.write_onnx(inference, str(out), ["a"] * 10)
  proto = onnx.load(str(out))
  described = function_exports.onnx_signature(proto)
  assert described["class_names"] == ["a"] * 10
  # Labelled as what it is: it once said "vit_jax.stablehlo", platforms and
  # all.
  assert described["format"] == "vit_jax.onnx"
  assert "platforms" not in described
  session = onnxruntime.InferenceSession(str(out))
  assert [i.name for i in session.get_inputs()] == ["pixels"]
  assert [o.name for o in session.get_outputs()] == list(
      function_exports.OUTPUTS)
  for batch in BATCHES:
    _, _, probabilities = session.run(None, {"pixels": pixels[:batch]})
    np.testing.assert_allclose(probabilities, expected[:batch], atol=1e-4)


def siglip2_tower(directory):
  tensors, config = todays.siglip_tensors(True, "hub")
  return write_hf_dir(directory, tensors, config)


def dinov2_with_registers(directory):
  tensors = random_tensors(todays.dinov2_shapes(todays.REGISTERS))
  return write_hf_dir(directory, tensors,
                      todays.dinov2_config(todays.REGISTERS))


@pytest.mark.parametrize("make", [siglip2_tower, dinov2_with_registers])
def test_todays_towers_export_to_both_formats(make, tmp_path):
  loaded = pretrained.load(make(tmp_path / "hf"))
  # Towers come without a classifier: give them one, as a fine-tune would.
  loaded = dataclasses.replace(
      loaded, params={**loaded.params, "head": todays.random_head()})
  inference = pretrained.inference_of(loaded)
  rng = np.random.default_rng(0)
  size = inference.image_size
  pixels = rng.integers(0, 256, (3, size, size, 3), np.uint8)
  logits, state = inference.model.apply(
      {"params": inference.params}, pixels, train=False,
      mutable=["intermediates"])
  pre_logits = state["intermediates"]["features"][0]
  assert np.abs(logits).max() > 1

  exports.write(loaded, "stablehlo", str(tmp_path / "m.stablehlo"))
  served = serving.load(str(tmp_path / "m.stablehlo"))
  got = served(pixels)
  np.testing.assert_allclose(got["logits"], logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["pre_logits"], pre_logits, rtol=1e-5,
                             atol=1e-5)

  exports.write(loaded, "onnx", str(tmp_path / "m.onnx"))
  session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
  got_logits, got_pre_logits, _ = session.run(None, {"pixels": pixels})
  np.testing.assert_allclose(got_logits, logits, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got_pre_logits, pre_logits, rtol=1e-4,
                             atol=1e-4)


@pytest.mark.parametrize("crop_fraction", [1.0, 0.875])
def test_the_loaders_resize_is_evaluations_bit_for_bit(crop_fraction):
  rng = np.random.default_rng(0)
  for height, width in [(8, 8), (5, 7), (37, 53), (224, 224), (480, 640),
                        (17, 300)]:
    image = rng.integers(0, 256, (height, width, 3), np.uint8)
    for size in (8, 32, 224):
      np.testing.assert_array_equal(
          serving.eval_resize(image, size, crop_fraction),
          preprocess.eval_resize(image, size, crop_fraction).numpy(),
          err_msg=f"{height}x{width} -> {size}")


def test_the_loader_takes_grey_and_alpha_and_refuses_other_pixels(
    digits_export):
  _, _, _, out, _ = digits_export
  served = serving.load(out)
  grey = np.full((16, 16), 200, np.uint8)
  rgba = np.full((8, 8, 4), 200, np.uint8)
  pixels = served.pixels([grey, rgba])
  assert pixels.shape == (2, 8, 8, 3) and (pixels == 200).all()
  with pytest.raises(ValueError, match=r"uint8 pixels \[N, 8, 8, 3\]"):
    served(pixels.astype(np.float32))
  with pytest.raises(ValueError, match="not a vit_jax StableHLO export"):
    serving.load(_zip_of({"other.txt": "x"}))


def _zip_of(members):
  import io  # pylint: disable=g-import-not-at-top
  import zipfile  # pylint: disable=g-import-not-at-top
  data = io.BytesIO()
  with zipfile.ZipFile(data, "w") as archive:
    for name, text in members.items():
      archive.writestr(name, text)
  return data.getvalue()


def test_a_missing_or_foreign_stablehlo_is_one_line(tmp_path):
  with pytest.raises(errors.InputError, match="does not exist"):
    function_exports.load_stablehlo(str(tmp_path / "none.stablehlo"))
  (tmp_path / "x.stablehlo").write_bytes(b"not a zip")
  with pytest.raises(errors.InputError, match="x.stablehlo"):
    function_exports.load_stablehlo(str(tmp_path / "x.stablehlo"))


def test_the_standalone_loader_names_a_url_it_cannot_read():
  with pytest.raises(ValueError, match="gs://b/m.stablehlo: this loader reads "
                     "local files .* copy the file here first"):
    serving.load("gs://b/m.stablehlo")


def test_a_stablehlo_export_cut_short_is_one_line(digits_export, tmp_path):
  """Its module cut short inside a whole archive (the archive itself cut
  short is not a zip: above)."""
  with zipfile.ZipFile(digits_export[3]) as archive:
    members = {name: archive.read(name) for name in archive.namelist()}
  cut = tmp_path / "cut.stablehlo"
  with zipfile.ZipFile(cut, "w") as archive:
    for name, data in members.items():
      archive.writestr(name, data[:len(data) // 2] if name == serving.MODULE
                       else data)
  status, stdout, stderr = call_tool("predict", f"--from={cut}",
                                     digits_export[4])
  assert (status, stdout) == (2, "")
  assert stderr.startswith(f"error: {cut}: its {serving.MODULE} does not "
                           "read: cut short or damaged (")
  assert len(stderr.splitlines()) == 1


@pytest.mark.parametrize("name, content, says", [
    ("x.npz", b"PK\x03\x04cut", "is not an .npz file of arrays"),
    ("x.safetensors", b"\x10" + bytes(7) + b'{"cut', "is not a .safetensors"),
    ("x.stablehlo", b"PK\x03\x04cut", "File is not a zip file"),
    ("x.onnx", b"\x08\x07cut", "exported as a function"),
])
def test_a_damaged_file_of_each_format_is_one_line(tmp_path, name, content,
                                                   says):
  """Each a file cut short a few bytes in, given where params are read."""
  damaged = tmp_path / name
  damaged.write_bytes(content)
  image = os.path.join(REPO, "docs", "digits_attention_rollout.png")
  status, stdout, stderr = call_tool("predict", f"--from={damaged}", image)
  assert (status, stdout) == (2, "")
  assert stderr.startswith(f"error: {damaged}") and says in stderr
  assert len(stderr.splitlines()) == 1


@pytest.mark.parametrize("format_,out,named", [
    ("stablehlo", "x.npz", "name it x.stablehlo"),
    ("npz", "x.stablehlo", "name it x.npz"),
    ("timm", "x.bin", "name it x.safetensors"),
    ("onnx", "x", "name it x.onnx"),
    ("hf", "x.npz", "writes a folder; a name ending in .npz says another "
     "format (--format=npz)")])
def test_an_out_whose_name_says_another_format_is_refused(
    digits_run, tmp_path, format_, out, named):
  """A .npz holding StableHLO was written, and the predict command that
  export printed for it failed in a traceback."""
  out = str(tmp_path / out)
  status, stdout, stderr = call_tool("export", f"--workdir={digits_run[0]}",
                                     f"--format={format_}", f"--out={out}")
  assert (status, stdout) == (2, "")
  assert stderr.startswith(f"error: --out={out}: ") and named in stderr
  assert len(stderr.splitlines()) == 1
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("format_,out", [("npz", "x.npz"), ("onnx", "x.onnx")])
def test_platforms_are_refused_where_the_format_has_none(digits_run, tmp_path,
                                                         format_, out):
  status, stdout, stderr = call_tool(
      "export", f"--workdir={digits_run[0]}", f"--format={format_}",
      f"--out={tmp_path / out}", "--platforms=tpu")
  assert (status, stdout) == (2, "")
  assert stderr == (f"error: --platforms: only --format=stablehlo is lowered "
                    f"for platforms; --format={format_} runs wherever its "
                    f"reader does\n")
  assert os.listdir(tmp_path) == []


def test_onnx_without_jax2onnx_says_how_to_install_it(digits_export,
                                                      monkeypatch, tmp_path):
  inference = digits_export[0]
  monkeypatch.setitem(sys.modules, "jax2onnx", None)
  with pytest.raises(errors.InputError, match=r"pip install 'vit_jax\[onnx\]'"):
    function_exports.write_onnx(inference, str(tmp_path / "m.onnx"))
  assert not (tmp_path / "m.onnx").exists()


def test_an_exported_function_is_no_source_of_params(digits_export):
  out = digits_export[3]
  for read in (pretrained.load, pretrained.source_options):
    with pytest.raises(errors.InputError, match="exported as a function"):
      read(out)


def test_one_module_serves_each_platform_it_was_lowered_for(digits_export,
                                                            tmp_path):
  inference, pixels, expected, _, _ = digits_export
  both = str(tmp_path / "both.stablehlo")
  function_exports.write_stablehlo(inference, both,
                                   platforms=("cpu", "tpu", "cuda"))
  served = serving.load(both)
  assert served.signature["platforms"] == ["cpu", "tpu", "cuda"]
  np.testing.assert_allclose(served.probabilities(pixels[:3]), expected[:3],
                             atol=1e-5)
  tpu = str(tmp_path / "tpu.stablehlo")
  function_exports.write_stablehlo(inference, tpu, platforms=("tpu",))
  with pytest.raises(ValueError, match="--platforms=cpu"):
    serving.load(tpu)
  with pytest.raises(errors.InputError, match="cpu, tpu, cuda or rocm"):
    function_exports.write_stablehlo(inference, tpu, platforms=("gpu",))


def test_weights_too_large_for_one_file_are_refused_before_exporting(
    digits_export, monkeypatch, tmp_path):
  inference = digits_export[0]
  # H/14's 2.5 GB against 2 GiB, at the digits model's scale.
  monkeypatch.setattr(function_exports, "MAX_BYTES", 1000)
  for write in (function_exports.write_stablehlo,
                function_exports.write_onnx):
    with pytest.raises(errors.InputError, match="more than the 2 GiB"):
      write(inference, str(tmp_path / "m"))
  assert not os.listdir(tmp_path)
