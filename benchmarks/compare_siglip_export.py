"""A two-tower run, exported as transformers' SiglipModel, against the run
itself: the same logits of test digits against their class captions.

Two steps, in two environments (torch is no dependency of the project):

  # The project's: the run's logits, and its export.
  .venv/bin/python benchmarks/compare_siglip_export.py --workdir=W \
      --export=W_EXPORT --logits=/tmp/logits.npz
  # One with torch and transformers: the export's, compared.
  /work/torchvenv/bin/python benchmarks/compare_siglip_export.py \
      --export=W_EXPORT --logits=/tmp/logits.npz

The images are the first IMAGES test digits (the run's image size), the
texts each class's first caption (the run's tokenizer). The second step
prints the largest difference relative to the largest logit and exits 1
above --tolerance (1e-4).
"""

import argparse
import subprocess
import sys

import numpy as np

IMAGES = 16


def write_logits(workdir, export, out):
  # pylint: disable=g-import-not-at-top
  import jax
  from sklearn import datasets

  from vit_jax.data import captions as captions_lib, digits
  from vit_jax.runs.workdir import Workdir
  from vit_jax.training.objectives import image_text
  keys = Workdir(workdir).read_config()
  subprocess.run([sys.executable, "-m", "vit_jax.export",
                  f"--workdir={workdir}", f"--out={export}", "--format=hf"],
                 check=True)
  # The test digits as the run reads them: uint8 grey, to [-1, 1], RGB.
  loaded = datasets.load_digits()
  _, test = digits.split_indices(loaded.target)
  grey = digits.to_uint8(loaded.images[test[:IMAGES]])
  images = np.repeat(grey[..., None], 3, axis=-1).astype(np.float32)
  images = images / 127.5 - 1
  side = keys.image_size
  if side != images.shape[1]:
    images = np.asarray(jax.image.resize(
        images, (IMAGES, side, side, 3), "bilinear"))
  tokenizer = image_text.tokenizer_of(keys)
  texts = [captions[0] for captions in captions_lib.of_classes(
      keys.image_text.templates, keys.image_text.class_names)]
  ids = tokenizer.encode(texts)
  logits = np.asarray(image_text.contrastive_logits(workdir, images, ids))
  np.savez(out, images=images, ids=ids, logits=logits)
  print(f"wrote {out}: {workdir}'s logits of {IMAGES} test digits against "
        f"{len(texts)} captions ({texts[:2]}...)")


def compare(export, logits_file, tolerance):
  # pylint: disable=g-import-not-at-top
  import torch
  import transformers
  torch.set_num_threads(1)
  saved = np.load(logits_file)
  model = transformers.AutoModel.from_pretrained(export).eval().double()
  pixels = torch.from_numpy(saved["images"].transpose(0, 3, 1, 2)).double()
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(saved["ids"]).long(),
                   pixel_values=pixels).logits_per_image.numpy()
  expected = saved["logits"]
  difference = np.abs(theirs - expected).max() / np.abs(expected).max()
  agree = np.mean(theirs.argmax(1) == expected.argmax(1))
  print(f"{type(model).__name__} (transformers {transformers.__version__}):"
        f" logits_per_image [{', '.join(map(str, theirs.shape))}], largest "
        f"difference {difference:.2e} of the largest logit; the same class "
        f"for {agree:.0%} of the images")
  return 0 if difference <= tolerance else 1


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="")
  parser.add_argument("--export", required=True)
  parser.add_argument("--logits", required=True)
  parser.add_argument("--tolerance", type=float, default=1e-4)
  args = parser.parse_args()
  if args.workdir:
    write_logits(args.workdir, args.export, args.logits)
    return 0
  return compare(args.export, args.logits, args.tolerance)


if __name__ == "__main__":
  sys.exit(main())
