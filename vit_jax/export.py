"""python -m vit_jax.export --workdir=DIR [--step=N] --out=PATH [--format=npz|hf|timm|stablehlo|onnx]
python -m vit_jax.export --from=SOURCE --out=PATH [--format=...]

Writes a model for other code to load: from a run's checkpoint (its Polyak
average when it kept one), or from any other source that
`config.init_from` takes (an .npz of any layout, an HF transformers
directory, a timm .safetensors).

  npz   the layout of the released vit_jax files, which the released code
        and timm's .npz loader read (the default).
  hf    a directory for transformers' ViTForImageClassification.from_pretrained:
        config.json (sizes, hidden_act and layer_norm_eps of the model's
        function, id2label from the class names) and model.safetensors.
  timm  a .safetensors state dict for timm's VisionTransformer; the command
        prints the lines that build the model and load it.
  stablehlo  the model's function (uint8 pixels in; logits, pre-logits and
        probabilities out; any batch size) as a jax.export module, lowered
        for --platforms, which vit_jax/serving.py runs with JAX and numpy
        only, and `predict --from=FILE.stablehlo` too.
  onnx  the same function as an ONNX model (through jax2onnx: pip install
        'vit_jax[onnx]'), for ONNX Runtime and the like.

With --class_names (and --templates), a two-tower source (an image_text
run, transformers' SiglipModel, big_vision's two towers) exports as a
zero-shot classifier, stablehlo or onnx: its classes' captions are
embedded by the text tower here, once, and baked in beside the image
tower, so a server needs neither the text tower nor a tokenizer; its
probabilities are SigLIP's sigmoid, each class's on its own.

--input_mean and --input_std fold a model's own input normalisation into
its patch embedding, so that it takes vit_jax's images ([-1, 1]): for a
model trained on (pixels / 255 - mean) / std, such as timm's ImageNet-
normalised ones (exports.fold_input_normalization).
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

from absl import flags, logging  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax import export as jax_export  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax import cli, errors, paths
from vit_jax.cli import shared_flags
from vit_jax.runs import workdir
from vit_jax.training.objectives import image_text
from vit_jax.weights import exports, pretrained

shared_flags.define_model_source("export", verb_from="convert")
flags.DEFINE_enum("format", "npz", list(exports.FORMATS), "What to write.")
flags.DEFINE_string("out", None, "The file (npz, timm, stablehlo, onnx) or "
                    "directory (hf) to write.")
flags.DEFINE_string("labels", "", "A text file of class names, one per line, "
                    "for hf's id2label (default: the source's, else the "
                    "run's dataset's).")
flags.DEFINE_list("platforms", [], "What a stablehlo export runs on: cpu, "
                  "tpu, cuda, rocm (default: cpu, and this machine's "
                  "platform if another).")
shared_flags.define_zero_shot("export a classifier of")
flags.mark_flag_as_required("out")


def main(argv):
  del argv  # cli.run refuses positional arguments.
  f = flags.FLAGS
  exports.check_out(f.format, f.out)
  if f.platforms and f.format != "stablehlo":
    raise errors.InputError(
        f"--platforms: only --format=stablehlo is lowered for platforms; "
        f"--format={f.format} runs wherever its reader does")
  paths.check_reachable(f.out, "--out", writes=True)
  exports.check_out_place(f.format, f.out)
  workdir.check_output(f.out, "--out")
  platforms = f.platforms or default_platforms()
  if f.class_names:
    write_zero_shot(platforms)
    return
  loaded = pretrained.load(shared_flags.source_from_flags(), f.num_heads)
  given = shared_flags.normalization_from_flags()
  if given:
    loaded = exports.fold_input_normalization(loaded, given.mean, given.std)
  for warning in exports.function_warnings(loaded, f.format):
    logging.warning(warning)
  how = exports.write(loaded, f.format, f.out, f.labels, platforms)
  print(f"wrote {paths.shown(f.out)} ({f.format}) from {loaded.what}")
  if how:
    print(how)


def write_zero_shot(platforms):
  """The export of --class_names: a two-tower source's zero-shot
  classifier, as a function."""
  f = flags.FLAGS
  if f.format not in exports.FUNCTIONS:
    raise errors.InputError(
        f"--class_names: a zero-shot classifier exports as a function "
        f"(--format={' or '.join(exports.FUNCTIONS)}), not "
        f"--format={f.format}, which writes the towers themselves")
  if f.labels or f.input_mean:
    raise errors.InputError(
        "--class_names names the classes; --labels and --input_mean do not "
        "apply to a zero-shot classifier")
  classifier = image_text.ZeroShotClassifier(
      shared_flags.source_from_flags(), f.class_names, f.templates,
      f.tokenizer)
  function = classifier.function()
  how = exports.write_function(function, f.format, f.out,
                               classifier.class_names, platforms)
  print(f"wrote {paths.shown(f.out)} ({f.format}) from {function.what}")
  print(how)


def default_platforms():
  here = jax_export.default_export_platform()  # "cuda", where JAX says "gpu"
  return ["cpu"] + ([here] if here != "cpu" else [])


if __name__ == "__main__":
  cli.run(main)
