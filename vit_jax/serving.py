"""Runs a model exported with `python -m vit_jax.export --format=stablehlo`,
without vit_jax: this module imports only Python's standard library, numpy
and JAX, so it may be copied alone to a server that has those.

    import serving  # this file, copied; or: from vit_jax import serving
    model = serving.load("model.stablehlo")
    pixels = model.pixels([image, ...])  # uint8 HxWx3 arrays, any size
    out = model(pixels)  # {"logits", "pre_logits", "probabilities"}

The file is a zip of two members: `module.stablehlo`, the serialized
`jax.export.Exported` of the model's function (uint8 pixels at the model's
resolution in, float32 outputs; any batch size), and `signature.json`,
which describes its input and outputs and names the classes.

The resize to the model's resolution happens here, in numpy, not in the
module: it reproduces TensorFlow's bilinear resize (which the run's
evaluation used) bit for bit, which a compiled program cannot promise, as
XLA may fuse and reorder float operations (docs/exports.md).
"""

import io
import json
import struct
import zipfile

import numpy as np
from jax import export

MODULE = "module.stablehlo"
SIGNATURE = "signature.json"
FORMAT = "vit_jax.stablehlo"
FORMAT_VERSION = 1


class Served:
  """An exported model: call it on uint8 pixels [N, S, S, 3] (S: its
  `image_size`) for a dict of float32 numpy arrays."""

  def __init__(self, exported, signature):
    self.exported = exported
    self.signature = signature

  @property
  def image_size(self):
    return self.signature["image_size"]

  @property
  def crop_fraction(self):
    return self.signature["crop_fraction"]

  @property
  def class_names(self):
    return self.signature.get("class_names")

  @property
  def output_names(self):
    return list(self.signature["outputs"])

  def __call__(self, pixels):
    pixels = np.asarray(pixels)
    expected = (self.image_size, self.image_size, 3)
    if pixels.dtype != np.uint8 or pixels.ndim != 4 or (
        pixels.shape[1:] != expected):
      raise ValueError(
          f"the model takes uint8 pixels [N, {', '.join(map(str, expected))}]"
          f", got {pixels.dtype} {list(pixels.shape)}: resize images first "
          "with .pixels(images)")
    outputs = self.exported.call(pixels)
    return {name: np.asarray(value)
            for name, value in zip(self.output_names, outputs)}

  def probabilities(self, pixels, batch_size=64):
    """The class probabilities of `pixels`, batch_size images at a time."""
    return np.concatenate([
        self(pixels[start:start + batch_size])["probabilities"]
        for start in range(0, len(pixels), batch_size)])

  def pixels(self, images):
    """Decoded images (uint8 arrays HxW, HxWx1, HxWx3 or HxWx4, any size)
    as the model's input, resized as the run's evaluation resized them."""
    return np.stack([eval_resize(as_rgb(image), self.image_size,
                                 self.crop_fraction) for image in images])


def load(file):
  """The Served model in `file`: a local path, an open binary file or the
  file's bytes."""
  if isinstance(file, (bytes, bytearray)):
    file = io.BytesIO(file)
  elif isinstance(file, str) and "://" in file:
    raise ValueError(f"{file}: this loader reads local files (it needs no "
                     "more than JAX and numpy); copy the file here first, "
                     "or give its bytes")
  with zipfile.ZipFile(file) as archive:
    names = set(archive.namelist())
    if not {MODULE, SIGNATURE} <= names:
      raise ValueError(f"not a vit_jax StableHLO export: it holds "
                       f"{sorted(names)}, not {MODULE} and {SIGNATURE}")
    signature = json.loads(archive.read(SIGNATURE))
    if signature.get("format") != FORMAT or signature.get(
        "format_version", 0) > FORMAT_VERSION:
      raise ValueError(f"{SIGNATURE} describes format "
                       f"{signature.get('format')!r} version "
                       f"{signature.get('format_version')!r}; this loader "
                       f"reads {FORMAT!r} up to version {FORMAT_VERSION}")
    try:
      exported = export.deserialize(bytearray(archive.read(MODULE)))
    except (struct.error, IndexError) as e:
      raise ValueError(f"its {MODULE} does not read: cut short or damaged "
                       f"({e})") from e
  platform = export.default_export_platform()  # "cuda", where JAX says "gpu"
  if platform not in exported.platforms:
    raise ValueError(f"exported for {', '.join(exported.platforms)}, not "
                     f"this machine's {platform}: export again with "
                     f"--platforms={platform}")
  return Served(exported, signature)


def as_rgb(image):
  """A decoded image as uint8 HxWx3: grey is repeated, alpha dropped (as
  TensorFlow's decode_image(channels=3) does)."""
  image = np.asarray(image)
  if image.dtype != np.uint8:
    raise ValueError(f"images are uint8 pixels, got {image.dtype}")
  if image.ndim == 2:
    image = image[..., None]
  if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
    raise ValueError(f"an image is HxW, HxWx1, HxWx3 or HxWx4, got "
                     f"{list(image.shape)}")
  if image.shape[-1] == 1:
    return np.repeat(image, 3, axis=-1)
  return image[..., :3]


def eval_resize(image, image_size, crop_fraction=1.0):
  """A uint8 HxWx3 image at [image_size, image_size, 3]: a plain bilinear
  resize, or with crop_fraction f < 1, a resize to round(image_size / f)
  and its central square (vit_jax's preprocess.eval_resize)."""
  if crop_fraction == 1:
    return resize(image, image_size)
  larger = round(image_size / crop_fraction)
  image = resize(image, larger)
  top = (larger - image_size) // 2
  return image[top:top + image_size, top:top + image_size]


def resize(image, size):
  """TensorFlow's tf.image.resize(bilinear) to [size, size] of uint8 HxWxC,
  in float32 with half-pixel centres, rounded half to even: the same
  bits. An image already that size is returned as it is."""
  if image.shape[:2] == (size, size):
    return image
  x = image.astype(np.float32)
  top, bottom, down = _samples(image.shape[0], size)
  left, right, across = _samples(image.shape[1], size)
  across = across[None, :, None]

  def along_rows(rows):
    return rows[:, left] + (rows[:, right] - rows[:, left]) * across

  upper, lower = along_rows(x[top]), along_rows(x[bottom])
  out = upper + (lower - upper) * down[:, None, None]
  return np.clip(np.round(out), 0, 255).astype(np.uint8)


def _samples(in_size, out_size):
  """Per output pixel: the two input pixels it lies between and its weight
  on the second, in TensorFlow's float32 order of operations."""
  scale = np.float32(in_size) / np.float32(out_size)
  source = ((np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale
            - np.float32(0.5))
  first = np.floor(source)
  weight = (source - first).astype(np.float32)
  first = first.astype(np.int64)
  return (np.clip(first, 0, in_size - 1), np.clip(first + 1, 0, in_size - 1),
          weight)
