"""A timm DINOv3 fine-tuned here, written back to timm and to transformers,
against what `predict` gives: the reproduction of a fine-tune that once
could go back to neither (its key bias trained, its class token a register).

  # 1. In a virtual environment of its own, never the project's: timm's
  #    vit_small_patch16_dinov3 with random weights (no download; every
  #    param perturbed), its state dict saved as .safetensors.
  python -m venv /tmp/torch && /tmp/torch/bin/pip install torch transformers timm
  /tmp/torch/bin/python benchmarks/dinov3_finetuned_back.py make --dir=/tmp/ft
  # 2. In the project's: `init_from` it on the digits at 32 x 32 for 6 steps
  #    (vit_jax.main), export the run with --format=timm and --format=hf, and
  #    `predict --json` (probabilities) and `predict --features --json` of a
  #    few digit pictures, whose pixels as predict reads them are saved too
  #    (in [-1, 1], as the model computes on them).
  .venv/bin/python benchmarks/dinov3_finetuned_back.py finetune --dir=/tmp/ft
  # 3. In the first: the exports loaded by timm (the printed lines) and by
  #    transformers (DINOv3ViTModel.from_pretrained) on those pixels.
  /tmp/torch/bin/python benchmarks/dinov3_finetuned_back.py back --dir=/tmp/ft

Step 3 prints the largest difference of timm's class probabilities from
predict's, and of the mean of transformers' last_hidden_state's patch
tokens (the model pools them: timm's DINOv3 ports average the patches)
from predict's features, each relative to the largest value. Not part of
the project's tests: steps 1 and 3 need torch.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

TIMM_MODEL = "vit_small_patch16_dinov3"
SIDE = 32  # The digits, resized to two patches a side.
STEPS = 6
PICTURES = 4


def make(directory):
  import safetensors.torch  # pylint: disable=g-import-not-at-top
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  model = timm.create_model(TIMM_MODEL, pretrained=False).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(0.02 * torch.randn_like(param))
  path = os.path.join(directory, "source.safetensors")
  safetensors.torch.save_file(model.state_dict(), path)
  print(f"saved {path} ({timm.__version__})")


def _run(*command):
  done = subprocess.run([sys.executable, "-m", *command],
                        capture_output=True, text=True)
  if done.returncode:
    sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
  return done.stdout


def finetune(directory):
  # pylint: disable=g-import-not-at-top
  import PIL.Image
  from sklearn import datasets

  from vit_jax.data import image_files
  workdir = os.path.join(directory, "run")
  _run("vit_jax.main", "--config=configs/digits.py", f"--workdir={workdir}",
       f"--config.init_from={os.path.join(directory, 'source.safetensors')}",
       "--config.model.name=S/16", "--config.model.hidden_size=384",
       "--config.model.num_layers=12", "--config.model.mlp_dim=1536",
       "--config.model.num_heads=6",
       f"--config.image_size={SIDE}", f"--config.total_steps={STEPS}",
       "--config.batch_size=16", "--config.log_every=1",
       "--config.optimizer.warmup_steps=1", "--config.model.dropout_rate=0",
       "--config.evaluators.test.every=0")
  for fmt, out in (("timm", "back.safetensors"), ("hf", "back_hf")):
    printed = _run("vit_jax.export", f"--workdir={workdir}", f"--format={fmt}",
                   f"--out={os.path.join(directory, out)}")
    print(printed)
    if fmt == "timm":
      with open(os.path.join(directory, "load_back.py"), "w") as f:
        f.write(printed[printed.index("import "):])
  digits = datasets.load_digits().images[:PICTURES]
  files = []
  for i, digit in enumerate(digits):
    files.append(os.path.join(directory, f"digit_{i}.png"))
    PIL.Image.fromarray((digit * 255 / 16).astype(np.uint8)).convert(
        "RGB").save(files[-1])
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  pixels = image_files.from_files(files, config["image_size"],
                                  config["eval_crop_fraction"])
  # uint8, as the model takes them: it scales them to [-1, 1] itself.
  assert pixels.dtype == np.uint8
  np.save(os.path.join(directory, "pixels.npy"),
          pixels.astype(np.float32) / 127.5 - 1)
  rows = [json.loads(line) for line in _run(
      "vit_jax.predict", f"--workdir={workdir}", "--json", "--top=10",
      *files).splitlines()]
  probabilities = np.zeros((PICTURES, 10))
  for i, row in enumerate(rows):
    for top in row["top"]:
      probabilities[i, int(top["class"])] = top["probability"]
  np.save(os.path.join(directory, "predict_probabilities.npy"),
          probabilities)
  features = [json.loads(line)["features"] for line in _run(
      "vit_jax.predict", f"--workdir={workdir}", "--features", "--json",
      *files).splitlines()]
  np.save(os.path.join(directory, "predict_features.npy"),
          np.asarray(features))
  print(f"predicted {PICTURES} digits; step 3 compares")


def _relative(got, expected):
  return np.abs(np.asarray(got) - expected).max() / np.abs(expected).max()


def back(directory):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  pixels = torch.from_numpy(np.load(os.path.join(
      directory, "pixels.npy")).transpose(0, 3, 1, 2).astype(np.float64))
  here = os.getcwd()
  os.chdir(directory)  # The printed lines name the file there.
  scope = {}
  with open("load_back.py") as f:
    exec(f.read(), scope)  # pylint: disable=exec-used
  os.chdir(here)
  timm_model = scope["model"].eval().double()
  with torch.no_grad():
    probabilities = torch.softmax(timm_model(pixels), -1).numpy()
  expected = np.load(os.path.join(directory, "predict_probabilities.npy"))
  print(f"timm Eva, class probabilities against predict --json: "
        f"{_relative(probabilities, expected):.2e}")
  hf = transformers.DINOv3ViTModel.from_pretrained(
      os.path.join(directory, "back_hf")).eval().double()
  with torch.no_grad():
    tokens = hf(pixel_values=pixels).last_hidden_state
  prefix = 1 + hf.config.num_register_tokens
  features = tokens[:, prefix:].mean(1).numpy()
  expected = np.load(os.path.join(directory, "predict_features.npy"))
  print(f"transformers DINOv3ViTModel, patch tokens' mean against predict "
        f"--features --json: {_relative(features, expected):.2e}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("step", choices=("make", "finetune", "back"))
  parser.add_argument("--dir", required=True)
  args = parser.parse_args()
  os.makedirs(args.dir, exist_ok=True)
  directory = os.path.abspath(args.dir)
  {"make": make, "finetune": finetune, "back": back}[args.step](directory)


if __name__ == "__main__":
  main()
