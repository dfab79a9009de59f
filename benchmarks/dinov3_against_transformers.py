"""vit_jax's reading and writing of a DINOv3 ViT, against transformers itself.

  # 1. In a virtual environment of its own, never the project's: a random
  #    DINOv3ViTModel (ViT-S/16, 4 registers, every param perturbed) saved
  #    with save_pretrained, and its pooled outputs in float64.
  python -m venv /tmp/torch && /tmp/torch/bin/pip install torch transformers
  /tmp/torch/bin/python benchmarks/dinov3_against_transformers.py make \
      --dir=/tmp/dinov3
  # 2. In the project's: ours on the same arrays, as images and as NaFlex
  #    patches, and the model written back with export --format=hf.
  .venv/bin/python benchmarks/dinov3_against_transformers.py check \
      --dir=/tmp/dinov3
  # 3. In the first: the written-back directory against the original.
  /tmp/torch/bin/python benchmarks/dinov3_against_transformers.py back \
      --dir=/tmp/dinov3

Each step prints the largest difference relative to the largest output.
Inputs are the same [-1, 1] arrays for both, at 224 x 224 and 160 x 256.
Not part of the project's tests: steps 1 and 3 need torch.
"""

import argparse
import os

import numpy as np

SHAPES = {"square": (224, 224), "wide": (160, 256)}
PATCH = 16


def make(directory):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = transformers.DINOv3ViTConfig(
      hidden_size=384, intermediate_size=1536, num_hidden_layers=12,
      num_attention_heads=6, num_register_tokens=4, patch_size=PATCH,
      image_size=224)
  model = transformers.DINOv3ViTModel(config).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.02 * torch.randn_like(param))
  model.save_pretrained(os.path.join(directory, "hf"))
  model = model.double()
  rng = np.random.default_rng(0)
  for name, (height, width) in SHAPES.items():
    images = rng.uniform(-1, 1, (2, 3, height, width))
    with torch.no_grad():
      pooled = model(pixel_values=torch.from_numpy(images)).pooler_output
    np.save(os.path.join(directory, f"{name}_images.npy"), images)
    np.save(os.path.join(directory, f"{name}_pooled.npy"), pooled.numpy())
  print(f"saved {directory}/hf and the pooled outputs of "
        f"{', '.join(SHAPES)} images")


def _relative(got, expected):
  return np.abs(np.asarray(got) - expected).max() / np.abs(expected).max()


def check(directory):
  # pylint: disable=g-import-not-at-top
  from vit_jax import models
  from vit_jax.models import naflex
  from vit_jax.weights import exports, pretrained
  source = os.path.join(directory, "hf")
  inference = pretrained.for_inference(source, features=True)
  for name, (height, width) in SHAPES.items():
    images = np.load(os.path.join(directory, f"{name}_images.npy"))
    images = images.transpose(0, 2, 3, 1).astype(np.float32)
    expected = np.load(os.path.join(directory, f"{name}_pooled.npy"))
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
  print(exports.write(pretrained.load(source), "hf",
                      os.path.join(directory, "back")))


def back(directory):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.DINOv3ViTModel.from_pretrained(
      os.path.join(directory, "back")).eval().double()
  for name in SHAPES:
    images = np.load(os.path.join(directory, f"{name}_images.npy"))
    expected = np.load(os.path.join(directory, f"{name}_pooled.npy"))
    with torch.no_grad():
      pooled = model(pixel_values=torch.from_numpy(images)).pooler_output
    print(f"{name}, written back: {_relative(pooled.numpy(), expected):.2e}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("step", choices=("make", "check", "back"))
  parser.add_argument("--dir", required=True)
  args = parser.parse_args()
  os.makedirs(args.dir, exist_ok=True)
  {"make": make, "check": check, "back": back}[args.step](args.dir)


if __name__ == "__main__":
  main()
