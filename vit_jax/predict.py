"""python -m vit_jax.predict --workdir=DIR | --npz=FILE --images=PATH,... [--labels=FILE]

The top classes of a trained model on your images, with probabilities.
Images (PNG, JPEG, GIF, BMP files, folders of them, or glob patterns; also
as positional arguments) are resized to the model's resolution as the run's
evaluation resized them. Class names come from --labels (one per line), else
from the TFDS label names of --dataset (default: the run's dataset), else
they are class numbers. The model runs in float32 on one device.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

import functools  # pylint: disable=g-import-not-at-top,wrong-import-position
import json

import jax
import numpy as np
from absl import app, flags

from vit_jax import cli, images as images_lib, pretrained


def probabilities(inference, images, batch_size=64):
  """Softmax of the model's logits on uint8 `images`, [N, classes]."""
  apply = _apply(inference.model)
  return np.concatenate([
      np.asarray(apply(inference.params, images[start:start + batch_size]))
      for start in range(0, len(images), batch_size)])


@functools.lru_cache(maxsize=4)
def _apply(model):
  return jax.jit(lambda params, images: jax.nn.softmax(
      model.apply({"params": params}, images, train=False)))


def class_name(names, i):
  """The name of class `i`; "class i" where `names` has none."""
  return names[i] if names and i < len(names) else f"class {i}"


def top_classes(probs, k, names=None):
  """Per row of `probs`, the k best as [(class, name, probability)], best
  first."""
  k = min(k, probs.shape[-1])
  best = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
  return [[(int(i), class_name(names, int(i)), float(row[i])) for i in order]
          for row, order in zip(probs, best)]


def as_text(path, top):
  """The image's path, then a line per class: rank, probability, name."""
  return "\n".join([path] + [f"  {rank}. {p:7.2%}  {name}"
                             for rank, (_, name, p) in enumerate(top, 1)])


def as_json(path, top):
  return json.dumps({"image": path, "top": [
      {"class": c, "name": name, "probability": p} for c, name, p in top]})


def define_flags():
  pretrained.define_flags("run")
  images_lib.define_flags()
  flags.DEFINE_integer("top", 5, "How many classes to show per image.")
  flags.DEFINE_integer("batch_size", 64, "Images per forward pass.")
  flags.DEFINE_bool("json", False, "One JSON object per image instead of "
                    "text.")


def main(argv):
  f = flags.FLAGS
  paths = f.images + argv[1:]
  if not paths:
    raise app.UsageError("no images: give --images=PATH,... or paths")
  inference = pretrained.from_flags()
  files = images_lib.expand(paths)
  images = images_lib.from_files(files, inference.image_size,
                                 inference.crop_fraction)
  names = images_lib.name_classes(f.labels, *inference.data(f.dataset,
                                                            f.data_dir))
  tops = top_classes(probabilities(inference, images, f.batch_size), f.top,
                     names)
  for path, top in zip(files, tops):
    print(as_json(path, top) if f.json else as_text(path, top))


if __name__ == "__main__":
  define_flags()
  cli.run(main, positional=True)
