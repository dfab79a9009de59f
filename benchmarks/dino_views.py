"""How alike an initial model finds two crops of the same digit: the
signal self-distillation has to start from (docs/dino.md, "The digits").

  python benchmarks/dino_views.py [--config=configs/dino/digits.py:pretrain]
      [--images=256] [--config.dino.global_scale='(0.32,1.0)'
      --config.dino.flip_probability=0.5 --config.image_size=32 ...]

Draws the 2 global crops of each of the first `--images` training digits
as a run's step does (the config's crops: config.dino's scales and
probabilities, overridden as any run's keys are), passes both through
the initial model (seed 0) and prints, for its class tokens and its DINO
head's logits, each centred over the images: the mean cosine of the two
crops of one digit and of two different digits, how often a crop's nearest
among the other crops is its own digit's (view retrieval), and how often
it is a digit of the same class.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from vit_jax.runs import settings  # noqa: E402
from vit_jax.training import objectives  # noqa: E402


def agreement(a, b, labels):
  """(same-digit cosine, other-digit cosine, view retrieval, class match)
  of two views [N, D] of N images, centred over the images."""
  a, b = a - a.mean(0), b - b.mean(0)
  a = a / np.linalg.norm(a, axis=1, keepdims=True)
  b = b / np.linalg.norm(b, axis=1, keepdims=True)
  similarity = a @ b.T
  n = len(a)
  same = np.trace(similarity) / n
  other = (similarity.sum() - np.trace(similarity)) / (n * (n - 1))
  nearest = similarity.argmax(1)
  return (same, other, (nearest == np.arange(n)).mean(),
          (labels[nearest] == labels).mean())


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/dino/digits.py:pretrain")
  parser.add_argument("--images", type=int, default=256)
  # The rest are the config's own overrides (--config.image_size=32).
  args, overrides = parser.parse_known_args()
  config = config_flags.DEFINE_config_file("config")
  flags.FLAGS([sys.argv[0], f"--config={args.config}", *overrides])
  keys = settings.of(config.value)
  objective = objectives.of(keys)(keys, 10)
  params = objective.init_params(jax.random.key(0), keys.image_size)
  params = jax.tree.map(lambda p: getattr(p, "value", p), params,
                        is_leaf=lambda p: hasattr(p, "value"))
  model = objective.model
  digits = load_digits()
  repeat = keys.image_size // 8
  images = (digits.images[:args.images] * 255 / 16).astype(np.uint8)
  images = np.repeat(np.repeat(images, repeat, 1), repeat, 2)
  images = jnp.asarray(np.repeat(images[..., None], 3, -1))

  @jax.jit
  def views(images):
    crops = objective.prepare(
        {"image": images, "mask": jnp.ones((len(images),))}, 0)["global"]
    out = []
    for crop in (crops[:, 0], crops[:, 1]):
      cls, _ = model.apply({"params": params}, crop, method=model.backbone)
      out.append((cls, model.apply({"params": params}, cls,
                                   method=model.project)))
    return out

  (cls_a, logits_a), (cls_b, logits_b) = jax.device_get(views(images))
  labels = digits.target[:args.images]
  print(f"{' '.join([args.config, *overrides])}:")
  for name, a, b in (("class tokens", cls_a, cls_b),
                     ("head logits", logits_a, logits_b)):
    same, other, retrieval, match = agreement(np.asarray(a), np.asarray(b),
                                              labels)
    print(f"  {name:12s} cosine same digit {same:.3f}, other digits "
          f"{other:.3f} | view retrieval {retrieval:.3f} | nearest of the "
          f"same class {match:.3f}")


if __name__ == "__main__":
  main()
