"""A self-distilled run's teacher, exported as transformers' Dinov2Model
or as a timm model, against the run itself: the same pooled features.

Two steps, in two environments (torch is no dependency of the project):

  # The project's: the teacher's features on seeded images.
  .venv/bin/python benchmarks/compare_dinov2_export.py --workdir=W \
      --features=/tmp/features.npz
  # One with torch and transformers: the export's, compared.
  /work/torchvenv/bin/python benchmarks/compare_dinov2_export.py \
      --export=W_EXPORT --features=/tmp/features.npz

For timm, the lines `export --format=timm` prints after its first two
(which build the model and load the file) are run as a user would:

  .venv/bin/python -m vit_jax.export --workdir=W --out=W.safetensors \
      --format=timm | tail -n +3 > /tmp/load_timm.py
  /work/torchvenv/bin/python benchmarks/compare_dinov2_export.py \
      --timm_lines=/tmp/load_timm.py --features=/tmp/features.npz

The second prints the largest difference relative to the largest feature
and exits 1 above --tolerance (1e-4).
"""

import argparse
import sys

import numpy as np

IMAGES = 16
SEED = 0


def write_features(workdir, out):
  # pylint: disable=g-import-not-at-top
  from vit_jax.runs.workdir import Workdir
  from vit_jax.training import objectives
  from vit_jax.weights import pretrained
  keys = Workdir(workdir).read_config()
  objective = objectives.of(keys)(keys, 1)
  params, what = pretrained.load_run(workdir)
  side = keys.image_size
  images = np.random.default_rng(SEED).uniform(
      -1, 1, (IMAGES, side, side, 3)).astype(np.float32)
  features = np.asarray(objective.features(params, images))
  np.savez(out, images=images, features=features)
  print(f"wrote {out}: {what}'s features of {IMAGES} images")


def compare(export, timm_lines, features_file, tolerance):
  # pylint: disable=g-import-not-at-top
  import torch
  torch.set_num_threads(1)
  saved = np.load(features_file)
  # Both take the [-1, 1] images (the Dinov2Model's image processor says
  # mean 0.5 and std 0.5), channels first.
  pixels = torch.from_numpy(saved["images"].transpose(0, 3, 1, 2)).double()
  if timm_lines:
    import timm
    with open(timm_lines) as f:
      scope = {}
      exec(f.read(), scope)  # noqa: S102 - the export's own printed lines.
    model = scope["model"].eval().double()
    with torch.no_grad():
      pooled = model(pixels).numpy()  # num_classes=0: the pooled features.
    library = f"timm {timm.__version__}"
  else:
    import transformers
    model = transformers.AutoModel.from_pretrained(export).eval().double()
    with torch.no_grad():
      pooled = model(pixel_values=pixels).pooler_output.numpy()
    library = f"transformers {transformers.__version__}"
  expected = saved["features"]
  difference = np.abs(pooled - expected).max() / np.abs(expected).max()
  print(f"{type(model).__name__} ({library}): pooled features "
        f"[{', '.join(map(str, pooled.shape))}], largest difference "
        f"{difference:.2e} of the largest feature")
  return 0 if difference <= tolerance else 1


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="")
  parser.add_argument("--export", default="")
  parser.add_argument("--timm_lines", default="")
  parser.add_argument("--features", required=True)
  parser.add_argument("--tolerance", type=float, default=1e-4)
  args = parser.parse_args()
  if args.workdir:
    write_features(args.workdir, args.features)
    return 0
  return compare(args.export, args.timm_lines, args.features, args.tolerance)


if __name__ == "__main__":
  sys.exit(main())
