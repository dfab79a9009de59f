"""PyTorch's train step of the same ViTs, to set beside benchmarks/train_step.py.

  # In a virtual environment of its own, never the project's:
  python -m venv /tmp/torch && /tmp/torch/bin/pip install torch transformers
  /tmp/torch/bin/python benchmarks/torch_train_step.py [--models=Ti/16:32]
      [--modes=float32,bf16_autocast] [--steps=7]

HF transformers' `ViTForImageClassification` at the paper's sizes (Table 1:
Ti/16 is DeiT-Ti's width 192, 3 heads), 224 px, 1,000 classes, randomly
initialised; a step is forward, cross-entropy, backward and AdamW, on a
fixed random batch, with all the host's cores (`torch.set_num_threads`).
`bf16_autocast` runs the forward under `torch.autocast("cpu", bfloat16)`
with float32 params and optimizer, as our `model.dtype=bfloat16` does.
Timed after two warm-up steps as the median of --steps. Prints one
markdown row per configuration, img/s the figure to compare. Not part of
the project's dependencies or tests: it needs torch and transformers.
"""

import argparse
import os
import statistics
import time

import torch
import transformers

# Table 1 of the paper (and DeiT's Ti): width, depth, MLP, heads.
SIZES = {"Ti": (192, 12, 768, 3), "S": (384, 12, 1536, 6),
         "B": (768, 12, 3072, 12), "L": (1024, 24, 4096, 16)}


def model_for(name, image_size, num_classes=1000):
  variant, patch = name.split("/")
  width, depth, mlp, heads = SIZES[variant]
  config = transformers.ViTConfig(
      hidden_size=width, num_hidden_layers=depth, intermediate_size=mlp,
      num_attention_heads=heads, patch_size=int(patch), image_size=image_size,
      num_labels=num_classes, hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0)
  return transformers.ViTForImageClassification(config)


def time_step(name, batch, mode, image_size, steps, warmup=2):
  torch.manual_seed(0)
  model = model_for(name, image_size).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
  images = torch.randn(batch, 3, image_size, image_size)
  labels = torch.randint(0, 1000, (batch,))
  times = []
  for i in range(warmup + steps):
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16,
                        enabled=mode == "bf16_autocast"):
      logits = model(pixel_values=images).logits
    loss = torch.nn.functional.cross_entropy(logits.float(), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if i >= warmup:
      times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", default="Ti/16:32")
  parser.add_argument("--modes", default="float32,bf16_autocast")
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--steps", type=int, default=7)
  args = parser.parse_args()
  torch.set_num_threads(os.cpu_count())
  print(f"torch {torch.__version__}, transformers {transformers.__version__},"
        f" {torch.get_num_threads()} threads\n")
  print("| model | px | batch | mode | step s | img/s |")
  print("|---|---|---|---|---|---|")
  for entry in args.models.split(","):
    name, batch = entry.split(":")
    for mode in args.modes.split(","):
      seconds = time_step(name, int(batch), mode, args.image_size, args.steps)
      print(f"| {name} | {args.image_size} | {batch} | {mode} "
            f"| {seconds:.3f} | {int(batch) / seconds:.1f} |", flush=True)


if __name__ == "__main__":
  main()
