"""vit_jax's reading and writing of a DINOv3 ViT, against transformers and
timm themselves.

  # 1. In a virtual environment of its own, never the project's: a random
  #    DINOv3 (ViT-S/16, 4 registers, every param perturbed) saved as the
  #    library saves it (transformers: save_pretrained of a DINOv3ViTModel;
  #    timm: the state dict of vit_small_patch16_dinov3_qkvb, its query and
  #    value biases included, as .safetensors), and its pooled outputs in
  #    float64 (transformers' pooler_output; timm's
  #    forward_head(..., pre_logits=True), its default average).
  python -m venv /tmp/torch && /tmp/torch/bin/pip install torch transformers timm
  /tmp/torch/bin/python benchmarks/dinov3_against_torch.py make \
      --library=transformers --dir=/tmp/dinov3
  #    Also a random picture at the model's input size (a PNG) and its
  #    features through the library's own preprocessing (transformers'
  #    DINOv3ViTImageProcessor, saved beside the model; timm's
  #    create_transform of the model's data config).
  # 2. In the project's: ours on the same arrays, as images and as NaFlex
  #    patches, and the model written back (export --format=hf, or timm);
  #    `predict --features --json` of the picture. For timm,
  #    tests/reference_vit.py's float64 forward of the file too.
  .venv/bin/python benchmarks/dinov3_against_torch.py check \
      --library=transformers --dir=/tmp/dinov3
  # 3. In the first: the written-back model against the original (for
  #    timm, built by the very lines the export printed).
  /tmp/torch/bin/python benchmarks/dinov3_against_torch.py back \
      --library=transformers --dir=/tmp/dinov3

and the same with --library=timm (`--timm_model=vit_huge_plus_patch16_dinov3
--depth=2` for a SwiGLU one; timm's RoPE ViTs, `vit_base_patch16_rope_224`,
`..._rope_mixed_224` and `..._rope_ape_224`, the last at its table's grid
only; with --library=transformers, `--gated` makes the MLP SwiGLU's,
use_gated_mlp). Each step prints the largest difference
relative to the largest output. Inputs are the same [-1, 1] arrays for
both, at 224 x 224 and 160 x 256. Not part of the project's tests: steps
1 and 3 need torch.
"""

import argparse
import os
import sys

import numpy as np

# tests/reference_vit.py, beside vit_jax.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

SHAPES = {"square": (224, 224), "wide": (160, 256)}
PATCH = 16
TIMM_MODEL = "vit_small_patch16_dinov3_qkvb"


def _source(directory, library):
  return os.path.join(directory, "hf" if library == "transformers" else
                      "timm.safetensors")


def _perturbed(model):
  import torch  # pylint: disable=g-import-not-at-top
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.02 * torch.randn_like(param))
  return model


def make(directory, library, timm_model, depth, gated):
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  if library == "transformers":
    import transformers  # pylint: disable=g-import-not-at-top
    gated = {"use_gated_mlp": True, "hidden_act": "silu"} if gated else {}
    config = transformers.DINOv3ViTConfig(
        hidden_size=384, intermediate_size=1536,
        num_hidden_layers=depth or 12, num_attention_heads=6,
        num_register_tokens=4, patch_size=PATCH, image_size=224, **gated)
    model = _perturbed(transformers.DINOv3ViTModel(config).eval())
    model.save_pretrained(_source(directory, library))
    processor = transformers.DINOv3ViTImageProcessor()
    processor.save_pretrained(_source(directory, library))
    side = 224
    preprocess = lambda picture: processor(
        images=picture, return_tensors="pt")["pixel_values"]
    pool = lambda m, x: m(pixel_values=x).pooler_output
  else:
    import safetensors.torch  # pylint: disable=g-import-not-at-top
    import timm  # pylint: disable=g-import-not-at-top
    model = _perturbed(timm.create_model(
        timm_model, pretrained=False, dynamic_img_size=True,
        **({"depth": depth} if depth else {})).eval())
    safetensors.torch.save_file(model.state_dict(),
                                _source(directory, library))
    # At crop_pct 1.0 (the DINOv3s'; timm's RoPE ViTs' is 0.9) a picture at
    # the input size is not resampled.
    data_config = {**timm.data.resolve_data_config({}, model=model),
                   "crop_pct": 1.0}
    side = data_config["input_size"][-1]
    transform = timm.data.create_transform(**data_config)
    preprocess = lambda picture: transform(picture)[None]
    pool = lambda m, x: m.forward_head(m.forward_features(x),
                                       pre_logits=True)
  model = model.double()
  rng = np.random.default_rng(0)
  import PIL.Image  # pylint: disable=g-import-not-at-top
  picture = PIL.Image.fromarray(rng.integers(0, 256, (side, side, 3),
                                             np.uint8))
  picture.save(os.path.join(directory, f"{library}_picture.png"))
  with torch.no_grad():
    pooled = pool(model, preprocess(picture).double())
  np.save(os.path.join(directory, f"{library}_picture_pooled.npy"),
          pooled.numpy()[0])
  for name, (height, width) in SHAPES.items():
    images = rng.uniform(-1, 1, (2, 3, height, width))
    if getattr(model, "pos_embed", None) is not None and name != "square":
      continue  # A table is compared at its own grid only.
    with torch.no_grad():
      pooled = pool(model, torch.from_numpy(images))
    np.save(os.path.join(directory, f"{name}_images.npy"), images)
    np.save(os.path.join(directory, f"{library}_{name}_pooled.npy"),
            pooled.numpy())
  print(f"saved {_source(directory, library)} and the pooled outputs of "
        f"{', '.join(SHAPES)} images")


def _relative(got, expected):
  return np.abs(np.asarray(got) - expected).max() / np.abs(expected).max()


def check(directory, library, num_heads):
  # pylint: disable=g-import-not-at-top
  from vit_jax import models
  from vit_jax.models import naflex
  from vit_jax.weights import exports, pretrained
  source = _source(directory, library)
  inference = pretrained.for_inference(source, num_heads, features=True)
  for name, (height, width) in SHAPES.items():
    pooled_file = os.path.join(directory, f"{library}_{name}_pooled.npy")
    if not os.path.exists(pooled_file):
      continue
    images = np.load(os.path.join(directory, f"{name}_images.npy"))
    images = images.transpose(0, 2, 3, 1)
    expected = np.load(pooled_file)
    if library == "timm":
      import safetensors.numpy

      from tests import reference_vit
      tensors = safetensors.numpy.load_file(source)
      heads = inference.model.config.num_heads
      reference = (reference_vit.forward_eva_dinov3(tensors, images, heads)
                   if "reg_token" in tensors else
                   reference_vit.forward_eva_rope(tensors, images, heads,
                                                  features=True))
      print(f"{name} {height}x{width}, tests/reference_vit.py: "
            f"{_relative(reference, expected):.2e}")
    images = images.astype(np.float32)
    _, pooled = models.logits_and_pre_logits(inference.model,
                                             inference.params, images)
    print(f"{name} {height}x{width}, images: {_relative(pooled, expected):.2e}")
    rows, cols = height // PATCH, width // PATCH
    patches = images.reshape(-1, rows, PATCH, cols, PATCH, 3).transpose(
        0, 1, 3, 2, 4, 5).reshape(len(images), rows * cols, -1)
    budget = 256
    batch = naflex.Patches(
        np.pad(patches, ((0, 0), (0, budget - rows * cols), (0, 0))),
        np.array([[rows, cols]] * len(images), np.int32))
    _, pooled = models.logits_and_pre_logits(inference.model,
                                             inference.params, batch)
    print(f"{name} {height}x{width}, NaFlex patches at {rows}x{cols} in "
          f"{budget}: {_relative(pooled, expected):.2e}")
  _check_picture(directory, library, source, num_heads)
  back = os.path.join(directory, "back" if library == "transformers" else
                      "back.safetensors")
  how = exports.write(pretrained.load(source, num_heads), "hf" if library ==
                      "transformers" else "timm", back)
  print(how)
  if library == "timm":  # The lines that load it, for step 3.
    with open(os.path.join(directory, "load_back.py"), "w") as f:
      f.write(how.split("\n", 1)[1] + "\n")


def _check_picture(directory, library, source, num_heads):
  """`predict --features --json` of the picture, as a user runs it."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  command = [sys.executable, "-m", "vit_jax.predict", f"--from={source}",
             "--features", "--json",
             os.path.join(directory, f"{library}_picture.png")]
  if num_heads:
    command.append(f"--num_heads={num_heads}")
  done = subprocess.run(command, capture_output=True, text=True, check=True)
  notes = [line for line in done.stderr.splitlines()
           if line.startswith("note:")]
  got = json.loads(done.stdout)["features"]
  expected = np.load(os.path.join(directory,
                                  f"{library}_picture_pooled.npy"))
  print(f"picture through predict --features --json: "
        f"{_relative(got, expected):.2e}" + "".join(f"\n  {n}" for n in notes))


def back(directory, library):
  import torch  # pylint: disable=g-import-not-at-top
  if library == "transformers":
    import transformers  # pylint: disable=g-import-not-at-top
    model = transformers.DINOv3ViTModel.from_pretrained(
        os.path.join(directory, "back"))
    pool = lambda m, x: m(pixel_values=x).pooler_output
  else:
    os.chdir(directory)  # The printed lines name the file there.
    scope = {}
    with open("load_back.py") as f:
      exec(f.read(), scope)  # pylint: disable=exec-used
    model = scope["model"]
    pool = lambda m, x: m.forward_head(m.forward_features(x),
                                       pre_logits=True)
  model = model.eval().double()
  for name in SHAPES:
    pooled_file = os.path.join(directory, f"{library}_{name}_pooled.npy")
    if not os.path.exists(pooled_file):
      continue
    images = np.load(os.path.join(directory, f"{name}_images.npy"))
    expected = np.load(pooled_file)
    with torch.no_grad():
      pooled = pool(model, torch.from_numpy(images))
    print(f"{name}, written back: {_relative(pooled.numpy(), expected):.2e}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("step", choices=("make", "check", "back"))
  parser.add_argument("--library", choices=("transformers", "timm"),
                      required=True)
  parser.add_argument("--dir", required=True)
  parser.add_argument("--timm_model", default=TIMM_MODEL)
  parser.add_argument("--depth", type=int, default=0,
                      help="blocks of the timm model (0: its own)")
  parser.add_argument("--num_heads", type=int, default=None)
  parser.add_argument("--gated", action="store_true",
                      help="transformers: a SwiGLU MLP (use_gated_mlp)")
  args = parser.parse_args()
  os.makedirs(args.dir, exist_ok=True)
  directory = os.path.abspath(args.dir)
  if args.step == "make":
    make(directory, args.library, args.timm_model, args.depth, args.gated)
  elif args.step == "check":
    check(directory, args.library, args.num_heads)
  else:
    back(directory, args.library)


if __name__ == "__main__":
  main()
