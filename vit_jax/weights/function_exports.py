"""A model exported as a function that runs without vit_jax
(vit_jax.export --format=stablehlo|onnx).

Both formats hold the same function with the params baked in: uint8 RGB
pixels [batch, S, S, 3] at the model's resolution S in (any batch size),
scaled to [-1, 1] inside, and three float32 outputs: the logits, the
pre-logits (what the head reads: few-shot and retrieval use them) and the
softmax probabilities. A two-tower model's zero-shot classifier exports
the same way (training/objectives/image_text.py's ZeroShotClassifier):
its classes' text embeddings baked in beside its image tower, its
probabilities SigLIP's sigmoid. Each carries the same signature (a JSON
object: inputs, outputs and what they mean, the resize the run's
evaluation made, the class names).

  stablehlo  jax.export's serialized module, lowered for the platforms
             asked, in a zip beside the signature; vit_jax/serving.py (JAX
             and numpy only) loads and runs it.
  onnx       an ONNX model made by jax2onnx (an optional dependency: the
             `onnx` extra), the signature in its metadata under
             "vit_jax.signature"; ONNX Runtime and others run it.
"""

import contextlib
import dataclasses
import io
import json
import zipfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from vit_jax import errors, models, paths, serving

OUTPUTS = {
    "logits": "float32 [batch, classes]: the head's output",
    "pre_logits": "float32 [batch, width]: what the head reads",
    "probabilities": "float32 [batch, classes]: the softmax of the logits",
}
ONNX_METADATA_KEY = "vit_jax.signature"
# What one file of either format holds: jax.export writes a flatbuffer, ONNX
# a protobuf, each at most 2 GiB, and the weights are inside.
MAX_BYTES = 2**31
# The ONNX opset jax2onnx targets (the tests run it in ONNX Runtime 1.32).
ONNX_OPSET = 21


@dataclasses.dataclass(frozen=True)
class Function:
  """What an export holds: `infer`, uint8 pixels [batch, S, S, 3] ->
  float32 outputs in the order of `outputs` (name -> meaning), closing
  over `weights` (a tree of arrays); S is `image_size`, and images are
  resized to it as `crop_fraction` says (serving.eval_resize)."""
  infer: Callable
  weights: Any
  image_size: int
  crop_fraction: float
  what: str  # where the weights came from, for messages and the signature
  outputs: dict = dataclasses.field(default_factory=lambda: dict(OUTPUTS))


def inference_function(inference):
  """pixels (uint8 [batch, S, S, 3]) -> (logits, pre_logits,
  probabilities), the params of `inference` (a pretrained.Inference)
  closed over as constants."""
  model, params = inference
  params = jax.tree.map(jnp.asarray, params)

  def infer(pixels):
    logits, pre_logits = models.logits_and_pre_logits(model, params, pixels)
    return logits, pre_logits.astype(jnp.float32), jax.nn.softmax(logits)

  return infer


def function_of(model):
  """The Function of `model`: a Function as it is, or a classifier's
  pretrained.Inference."""
  if isinstance(model, Function):
    return model
  return Function(inference_function(model), model.params, model.image_size,
                  model.crop_fraction, model.what)


# What an ONNX export's signature says it is (a StableHLO one's:
# serving.FORMAT).
ONNX_FORMAT = "vit_jax.onnx"


def signature(model, class_names, platforms=None):
  """What the exported function of `model` (a Function or an Inference)
  takes and gives, for its reader; `platforms`: those a StableHLO module
  was lowered for, None for ONNX."""
  function = function_of(model)
  size = function.image_size
  widths = jax.eval_shape(function.infer,
                          jax.ShapeDtypeStruct((1, size, size, 3),
                                               jnp.uint8))
  return {
      "format": serving.FORMAT if platforms is not None else ONNX_FORMAT,
      "format_version": serving.FORMAT_VERSION,
      "source": function.what,
      "image_size": size,
      "crop_fraction": function.crop_fraction,
      "inputs": {"pixels": {
          "dtype": "uint8", "shape": ["batch", size, size, 3],
          "meaning": "RGB in [0, 255], resized as `resize` says"}},
      "resize": (
          "bilinear with half-pixel centres, rounded to uint8 (TensorFlow's "
          "tf.image.resize), to image_size; with crop_fraction f < 1, to "
          "round(image_size / f), then the central image_size square"),
      "outputs": {name: {"dtype": "float32",
                         "shape": ["batch", shape.shape[-1]],
                         "meaning": meaning}
                  for (name, meaning), shape in zip(function.outputs.items(),
                                                    widths)},
      **({"platforms": list(platforms)} if platforms is not None else {}),
      "jax_version": jax.__version__,
      "class_names": list(class_names) if class_names else None,
  }


def check_size(function):
  """An InputError where the float32 weights cannot fit in one file."""
  size = sum(np.asarray(x).size * 4 for x in jax.tree.leaves(function.weights))
  if size >= MAX_BYTES:
    raise errors.InputError(
        f"{function.what}: its float32 weights take "
        f"{paths.describe_bytes(size)}, more than the 2 GiB that one "
        "StableHLO or ONNX file holds (jax.export writes a flatbuffer, ONNX "
        "a protobuf); export --format=npz, hf or timm instead")


def _pixels_of_any_batch(function):
  size = function.image_size
  return jax.ShapeDtypeStruct(
      jax_export.symbolic_shape(f"batch, {size}, {size}, 3"), jnp.uint8)


def write_stablehlo(model, out, class_names=None, platforms=("cpu",)):
  """Writes `out`: serving.py's zip of the module and its signature;
  `model`: a Function, or a classifier's pretrained.Inference."""
  function = function_of(model)
  check_size(function)
  platforms = tuple(platforms)
  unknown = set(platforms) - {"cpu", "tpu", "cuda", "rocm"}
  if unknown or not platforms:
    raise errors.InputError(
        f"--platforms takes cpu, tpu, cuda or rocm, got "
        f"{','.join(platforms) or 'none'}")
  exported = jax_export.export(jax.jit(function.infer),
                               platforms=platforms)(
                                   _pixels_of_any_batch(function))
  described = signature(function, class_names, platforms)
  with paths.writing(out) as local:
    with zipfile.ZipFile(local, "w", zipfile.ZIP_STORED) as archive:
      archive.writestr(serving.MODULE, bytes(exported.serialize()))
      archive.writestr(serving.SIGNATURE, json.dumps(described, indent=1))


def write_onnx(model, out, class_names=None):
  """Writes `out`: the ONNX model, its signature in its metadata; `model`
  as write_stablehlo's."""
  function = function_of(model)
  check_size(function)
  try:
    import jax2onnx  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.InputError(
        "--format=onnx needs jax2onnx, which vit_jax does not install by "
        "default: pip install 'vit_jax[onnx]'") from e
  # jax2onnx prints its own debugging lines: shown only if it fails.
  chatter = io.StringIO()
  try:
    with contextlib.redirect_stdout(chatter):
      proto = jax2onnx.to_onnx(
          function.infer, [_pixels_of_any_batch(function)],
          model_name="vit_jax", opset=ONNX_OPSET, input_names=["pixels"],
          output_names=list(function.outputs))
  except Exception:
    print(chatter.getvalue()[-3000:])
    raise
  entry = proto.metadata_props.add()
  entry.key = ONNX_METADATA_KEY
  entry.value = json.dumps(signature(function, class_names))
  paths.write_atomically(out, proto.SerializeToString())


STABLEHLO_SUFFIX = ".stablehlo"


def load_stablehlo(path):
  """serving.load of the file at `path` (local or a URL); an InputError
  naming it where it is missing or not one of ours."""
  file = paths.path(path)
  if not file.is_file():
    raise errors.InputError(f"{path} does not exist (a file written by "
                            "vit_jax.export --format=stablehlo)")
  try:
    return serving.load(file.read_bytes())
  except (ValueError, zipfile.BadZipFile) as e:
    raise errors.InputError(f"{path}: {e}") from e


def onnx_signature(proto):
  """The signature an ONNX export of ours carries, or None."""
  for entry in proto.metadata_props:
    if entry.key == ONNX_METADATA_KEY:
      return json.loads(entry.value)
  return None
