"""Records big_vision's own SigLIP two towers, for
tests/test_siglip_interchange.py: what vit_jax reads of the .npz files
big_vision writes (its released SigLIP checkpoints' layout).

Run by hand with the project's Python (jax and flax; big_vision's model
code needs nothing else of big_vision's but its utils' imports), from a
checkout of google-research/big_vision:

  .venv/bin/python benchmarks/record_big_vision_siglip.py \
      --big_vision=CHECKOUT --out=tests/fixtures/libraries/big_vision_siglip

It imports big_vision.models.proj.image_text.two_towers from the checkout
alone (never this project's vit_jax), builds a small SigLIP (the image
tower: 2 blocks, width 48, 4 heads, MLP 96, patch 8 on 32 x 32 images,
MAP head, no projection; the text tower: 2 blocks, width 32, 4 heads, MLP
64, 64 tokens of vocabulary, 16 a text, projecting to 48; t' = log 10,
b = -1), initialises it, adds a seeded normal draw to every parameter
(weights 1/sqrt(fan in), tables and probes 0.5, the rest 0.2), and saves
its params as big_vision's checkpoints hold them: flattened with "/"
joining the names under "params/", np.savez. Then it records, in
float32 (big_vision's dtype), its normalised image and text embeddings
and its logits t * <image, text> + b on seeded images and token ids.
Written twice, the files are the same bytes.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

IMAGE = dict(patch_size=(8, 8), width=48, depth=2, mlp_dim=96, num_heads=4,
             pool_type="map", posemb="learn")
TEXT = dict(width=32, depth=2, mlp_dim=64, num_heads=4, vocab_size=64)
SIDE, LENGTH, IMAGES, TEXTS, SEED = 32, 16, 2, 3, 20260
TEMPERATURE, BIAS = 10.0, -1.0


def scale_of(name, shape):
  if any(part in name for part in ("pos_embedding", "probe", "embedding")):
    return 0.5
  if len(shape) >= 2:
    return 1.0 / float(np.sqrt(np.prod(shape[:-1])))
  return 0.2


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--big_vision", required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  sys.path.insert(0, os.path.abspath(args.big_vision))
  # pylint: disable=g-import-not-at-top
  import flax
  import jax
  import safetensors.numpy
  from big_vision.models.proj.image_text import two_towers
  model = two_towers.Model(image=IMAGE, text=TEXT, out_dim=(None, 48),
                           temperature_init=TEMPERATURE, bias_init=BIAS)
  rng = np.random.default_rng(SEED)
  images = rng.uniform(-1, 1, (IMAGES, SIDE, SIDE, 3)).astype(np.float32)
  ids = rng.integers(0, TEXT["vocab_size"], (TEXTS, LENGTH)).astype(np.int32)
  params = model.init(jax.random.key(0), images, ids)["params"]
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
  perturbed = {}
  for name in sorted(flat):
    value = np.asarray(flat[name], np.float32)
    perturbed[name] = (value + scale_of(name, value.shape) * rng.standard_normal(
        value.shape)).astype(np.float32)
  params = flax.traverse_util.unflatten_dict(perturbed, sep="/")
  zimg, ztxt, out = model.apply({"params": params}, images, ids)
  logits = np.asarray(zimg) @ np.asarray(ztxt).T * np.asarray(
      out["t"])[0] + np.asarray(out["b"])[0]
  os.makedirs(args.out, exist_ok=True)
  np.savez(os.path.join(args.out, "model.npz"),
           **{f"params/{name}": value for name, value in perturbed.items()})
  safetensors.numpy.save_file(
      {"square/images": images, "square/token_ids": ids},
      os.path.join(args.out, "inputs.safetensors"), metadata={"format": "np"})
  safetensors.numpy.save_file(
      {"square/logits_per_image": logits.astype(np.float32),
       "square/image_embeds": np.asarray(zimg, np.float32),
       "square/text_embeds": np.asarray(ztxt, np.float32)},
      os.path.join(args.out, "outputs.safetensors"),
      metadata={"format": "np"})
  commit = subprocess.run(["git", "-C", args.big_vision, "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
  with open(os.path.join(args.out, "model.json"), "w") as f:
    json.dump({"library": "big_vision", "class": "two_towers.Model",
               "image": {**IMAGE, "patch_size": list(IMAGE["patch_size"])},
               "text": TEXT, "out_dim": [None, 48],
               "temperature_init": TEMPERATURE, "bias_init": BIAS,
               "text_length": LENGTH,
               "versions": {"big_vision": commit or "unknown",
                            "jax": jax.__version__,
                            "flax": flax.__version__}},
              f, indent=2, sort_keys=True)
    f.write("\n")
  print(f"wrote {args.out}: logits {logits.round(3).tolist()}")


if __name__ == "__main__":
  main()
