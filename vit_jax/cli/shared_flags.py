"""Flags that several command-line tools share.

A tool calls the `define_*` it needs when it is imported, then reads them
through the matching function here. Library modules take plain arguments
and never read flags.
"""

import sys

from absl import flags
from ml_collections import config_flags

from vit_jax import errors, paths, runtime
from vit_jax.models import naflex
from vit_jax.weights import exports, pretrained
from vit_jax.weights.pytorch import files


def define_training():
  """--config, --workdir and how the processes of a pod find each other:
  the flags of the tools that train (vit_jax.main, vit_jax.vtab)."""
  config_flags.DEFINE_config_file("config", None,
                                  "An ml-collections config file.",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None,
                      "Where checkpoints, logs and metrics go.")
  flags.DEFINE_enum(
      "distributed", "auto", ["auto", "on", "off"],
      "Initialise jax.distributed: 'auto' does when --coordinator_address is "
      "given or on a Cloud TPU VM (whose slice JAX describes by itself).")
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0, e.g. 127.0.0.1:12345.")
  flags.DEFINE_integer("num_processes", None, "How many processes in all.",
                       lower_bound=1)
  flags.DEFINE_integer("process_id", None, "This process's index, from 0.",
                       lower_bound=0)
  flags.DEFINE_string(
      "compilation_cache", None,
      "Where compiled programs are kept between runs, so that a restart "
      "does not compile its step again: a directory or a gs:// path; '' "
      "turns it off. Default: $JAX_COMPILATION_CACHE_DIR, else "
      f"{runtime.DEFAULT_COMPILATION_CACHE}.")
  flags.mark_flags_as_required(["config", "workdir"])


def prepare_to_train():
  """runtime.prepare_to_train with the flags of define_training."""
  f = flags.FLAGS
  runtime.prepare_to_train(f.distributed, f.coordinator_address,
                           f.num_processes, f.process_id,
                           f.compilation_cache, f.verbose)


def define_model_source(verb, verb_from="use"):
  """--workdir, --step, --from and --num_heads: where a tool's model comes
  from (any source of pretrained.load)."""
  flags.DEFINE_string("workdir", None, f"A run's workdir, whose model to "
                      f"{verb}.")
  flags.DEFINE_integer("step", None, "The run's checkpoint (default: the "
                       "newest).", lower_bound=0)
  flags.DEFINE_string("from", None, f"A checkpoint file to {verb_from} "
                      "instead of a run: an .npz, an HF transformers ViT "
                      "directory, a timm .safetensors, or a hub model by "
                      "its name, hf://ORG/NAME[@REV] (read from the Hugging "
                      "Face cache, fetched where it is not there).")
  flags.DEFINE_integer("num_heads", None, "A timm file's attention heads, "
                       "where its width is none of the paper's variants'.",
                       lower_bound=1)
  flags.register_multi_flags_validator(
      ["workdir", "from"], lambda v: bool(v["workdir"]) != bool(v["from"]),
      "give exactly one of --workdir and --from")
  flags.DEFINE_list("input_mean", [], "The model's input mean per RGB "
                    "channel, in [0, 1] (e.g. 0.485,0.456,0.406), with "
                    "--input_std: folded into the patch embedding so that "
                    "the model takes vit_jax's images.")
  flags.DEFINE_list("input_std", [], "The model's input std per RGB channel "
                    "(e.g. 0.229,0.224,0.225).")
  flags.register_multi_flags_validator(
      ["input_mean", "input_std"],
      lambda v: bool(v["input_mean"]) == bool(v["input_std"]),
      "give both --input_mean and --input_std, or neither")


def define_zero_shot(verb):
  """--class_names, --templates and --tokenizer: a two-tower source's
  zero-shot classifier (image_text.ZeroShotClassifier)."""
  flags.DEFINE_list("class_names", [], f"Zero-shot: {verb} the classes "
                    "a two-tower source's text tower tells apart ('|' "
                    "between a class's synonyms).")
  flags.DEFINE_list("templates", ["a photo of a {}."], "Zero-shot: the "
                    "captions of each class, {} where its name goes.")
  flags.DEFINE_string("tokenizer", "", "Zero-shot: the SentencePiece model "
                      "of a SiglipModel directory that holds none.")


def source_from_flags():
  """The source (pretrained.load's) that define_model_source's flags name."""
  f = flags.FLAGS
  if f.workdir:
    paths.check_reachable(f.workdir, "--workdir")
    return f.workdir if f.step is None else f"{f.workdir}:{f.step}"
  paths.check_reachable(f["from"].value, "--from")
  return f["from"].value


def model_from_flags(features=False):
  """pretrained.inference_of the model define_model_source's flags name
  (`features`: a headless one too, for its features only), taking images
  as its source was trained on them (exports.in_own_input)."""
  loaded = exports.in_own_input(
      pretrained.load(source_from_flags(), flags.FLAGS.num_heads),
      normalization_from_flags(),
      say=lambda line: print(line, file=sys.stderr, flush=True))
  return pretrained.inference_of(loaded, features)


def normalization_from_flags():
  """--input_mean and --input_std as a files.Normalization, or None
  where they are not given."""
  f = flags.FLAGS
  if not f.input_mean:
    return None
  return files.Normalization(
      tuple(floats(f.input_mean, "--input_mean")),
      tuple(floats(f.input_std, "--input_std")), "--input_mean/--input_std")


def floats(values, flag):
  """A list flag's strings as floats; an InputError naming `flag` if not."""
  try:
    return [float(value) for value in values]
  except ValueError as e:
    raise errors.InputError(f"{flag} takes numbers: {e}") from e


def define_images():
  """--images, --labels, --dataset, --data_dir, --max_num_patches and
  --native_size: what a tool looks at, how, and what it calls the
  classes."""
  flags.DEFINE_list("images", [], "Image files, folders or globs (also taken "
                    "as positional arguments).")
  flags.DEFINE_string("labels", "", "A text file of class names, one per "
                      "line, in class order.")
  flags.DEFINE_string("dataset", "", "A dataset for the class names (TFDS "
                      "label names) and, where the tool takes them, sample "
                      "images (default: the run's).")
  flags.DEFINE_string("data_dir", "", "Its TFDS data_dir (default: the "
                      "run's).")
  flags.DEFINE_integer(
      "max_num_patches", 0, "NaFlex: each image at its own aspect ratio, "
      "resized to the largest grid of at most this many patches (0: square "
      "images at the model's resolution). Not given: as the run's "
      "evaluation read its images (a NaFlex or packed run's "
      "config.naflex.max_num_patches; else, and for a file, 0).",
      lower_bound=0)
  flags.DEFINE_bool(
      "native_size", False, "NaFlex: each image at its own size, shrunk "
      "only to fit, never enlarged (as a packed run evaluates). Not given: "
      "as the run's evaluation read its images (true for a packed run's).")


def naflex_budget(inference):
  """The models.naflex.Budget by which a tool reads images for
  `inference` (a pretrained.Inference), or None for square images: as its
  run's evaluation read them (inference.naflex; square for a file), each
  of --max_num_patches and --native_size that is given setting its part
  instead (--max_num_patches=0: square)."""
  f = flags.FLAGS
  model, evaluated = inference.model, inference.naflex
  max_num_patches = (evaluated.max_num_patches if evaluated and not
                     f["max_num_patches"].present else f.max_num_patches)
  native = (not evaluated.fill if evaluated and not f["native_size"].present
            else f.native_size)
  if f.native_size and not max_num_patches:
    raise errors.InputError("--native_size reads images NaFlex-style: give "
                            "--max_num_patches too")
  budget = naflex.budget_of(max_num_patches, model, packing=native)
  if budget:
    naflex.check_budget(model.config, budget.max_num_patches)
  return budget
