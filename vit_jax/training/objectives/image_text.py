"""Image-text pre-training: SigLIP's two towers and sigmoid loss (Zhai et
al., ICCV 2023), or CLIP's softmax loss; config.objective "image_text",
config.image_text's keys; the model is models/two_towers.py's, the losses
training/contrastive.py's.

The texts: a captioned dataset's (data/captioned.py's folders, TFDS
datasets with a "captions" feature), one of each image's drawn and
tokenised in the input pipeline (data/pipeline.py), where
config.image_text.templates is empty; or a labelled dataset's images
captioned from templates and class names (config.image_text.templates,
class_names; data/captions.py):
each class's captions are tokenised once, when the run is built, and the
step draws one of them for each image from the run's seed, the step and
the image's row of the global batch (its place in the data's stream), so a
resumed run, or one on another mesh, captions what an uninterrupted one
captioned. The tokenizer is a SentencePiece model file, or one trained on
the run's captions when it starts (tokenizer "captions:N": the same
captions give the same model).

`contrastive_logits(source, images, token_ids)` runs a source's two
towers (a workdir of an image_text run, or transformers' SiglipModel
directory) on images and token ids, so its numbers can be compared with
another library's.

The loss of a micro-batch pairs its images with its texts only: every
other row of the micro-batch is a negative (big_vision's trainer takes the
whole batch; set config.accum_steps to 1 to match it). A row whose image
did not decode weighs nothing and is no negative.
"""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors, models, paths
from vit_jax.data import captions as captions_lib, tokenizer as tokenizer_lib
from vit_jax.models import flops, naflex
from vit_jax.runs.workdir import Workdir
from vit_jax.training import contrastive
from vit_jax.training.objectives import base
from vit_jax.weights import function_exports, pretrained
from vit_jax.weights.pytorch import siglip as pytorch_siglip

# Folded into the run's seed for the captions' draws: a stream of their own.
CAPTION_STREAM = 0x63617074  # "capt"
TRAINED_TOKENIZER = "captions:"


def model_of(keys):
  """The TwoTowers of a run's Settings `keys`: config.model's image tower
  and config.image_text's text tower."""
  return models.two_towers_from_settings(keys.model, keys.image_text)


def tokenizer_of(keys):
  """config.image_text's tokenizer, at its text length: read from its
  file, or trained on the run's captions."""
  spec, length = keys.image_text.tokenizer, keys.image_text.text_length
  if spec.startswith(TRAINED_TOKENIZER):
    texts = [text for texts in captions_lib.of_classes(
        keys.image_text.templates, keys.image_text.class_names)
             for text in texts]
    pieces = int(spec[len(TRAINED_TOKENIZER):])
    return tokenizer_lib.Tokenizer(tokenizer_lib.train(texts, pieces),
                                   length)
  return tokenizer_lib.Tokenizer.read(spec, length)


class ImageText(base.Objective):
  """Two towers trained on pairs: the module docstring."""

  name = "image_text"
  evaluator_kinds = ("zero_shot", "retrieval", "knn", "fewshot")

  def __init__(self, keys, num_classes, frozen=None):
    del frozen
    super().__init__(model_of(keys), keys.seed)
    settings = keys.image_text
    self.loss_kind, self.chunked = settings.loss, settings.chunked
    self.batch_size = keys.batch_size // keys.accum_steps
    self.templates = settings.templates
    if self.templates:
      try:
        captions_lib.check(settings.templates, settings.class_names,
                           num_classes, "config.image_text")
      except errors.InputError as e:
        raise errors.ConfigError(str(e)) from None
    self.keys = keys
    self.caption_ids = self.caption_counts = None
    if self.templates:
      self.caption_ids, self.caption_counts = captions_lib.table(
          self.tokenizer, captions_lib.of_classes(settings.templates,
                                                  settings.class_names))

  @functools.cached_property
  def tokenizer(self):
    """config.image_text's tokenizer, read (or trained) where first
    needed: a plan compiles the step without it."""
    tokenizer = tokenizer_of(self.keys)
    vocab = self.keys.image_text.text_vocab_size
    if tokenizer.vocab_size > vocab:
      raise errors.ConfigError(
          f"config.image_text.tokenizer has {tokenizer.vocab_size} pieces, "
          f"more than config.image_text.text_vocab_size={vocab}: raise it "
          "to at least that")
    return tokenizer

  @classmethod
  def check(cls, keys):
    settings = keys.image_text
    if not settings.tokenizer:
      raise errors.ConfigError(
          "config.image_text.tokenizer is unset: give a SentencePiece "
          f".model file, or {TRAINED_TOKENIZER}N to train N pieces on the "
          "run's captions")
    if settings.tokenizer.startswith(TRAINED_TOKENIZER):
      if not settings.templates:
        raise errors.ConfigError(
            f"config.image_text.tokenizer={settings.tokenizer!r} trains on "
            "the captions of config.image_text.templates, which is empty: "
            "give a SentencePiece .model file for a captioned dataset")
      count = settings.tokenizer[len(TRAINED_TOKENIZER):]
      if not count.isdigit() or int(count) < 4:
        raise errors.ConfigError(
            f"config.image_text.tokenizer={settings.tokenizer!r}: "
            f"{TRAINED_TOKENIZER}N takes a number of pieces N >= 4")
    if settings.loss == "softmax" and settings.chunked:
      raise errors.ConfigError(
          "config.image_text.chunked applies to the sigmoid loss: CLIP's "
          "softmax normalises over every text at once; set "
          "config.image_text.chunked=False")
    cls.refuse_set("config.objective='image_text'",
                   "pairs square images with texts, one image a row", (
        ("config.model.mpp", keys.model.mpp, False),
        ("config.distill.teacher", keys.distill.teacher, ""),
        ("config.naflex.packing", keys.naflex.packing, False),
        ("config.mixup.prob", keys.mixup.prob, 0.0),
        ("config.cutmix.prob", keys.cutmix.prob, 0.0),
        ("config.label_smoothing", keys.label_smoothing, 0.0)))

  @classmethod
  def reads_labels(cls, keys):
    """Where it captions labels from templates; a captioned dataset's
    texts are its own."""
    return bool(keys.image_text.templates)

  @classmethod
  def reads_captions(cls, keys):
    return not keys.image_text.templates

  def tokenize(self):
    """The input pipeline tokenises a captioned dataset's captions; a
    labelled one's are drawn in the step."""
    return None if self.templates else self.tokenizer.encode_bytes

  def targets(self, batch_size):
    """Labels to caption, or the pipeline's tokens of captions."""
    if self.templates:
      return super().targets(batch_size)
    return {"tokens": ((batch_size, self.keys.image_text.text_length),
                       jnp.int32)}

  @classmethod
  def paths(cls, keys):
    spec = keys.image_text.tokenizer
    if spec.startswith(TRAINED_TOKENIZER):
      return ()
    return ((spec, "config.image_text.tokenizer"),)

  def init_params(self, rng, image_size):
    images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
    token_ids = jnp.zeros((1, self.keys.image_text.text_length), jnp.int32)
    return self.model.init(rng, images, token_ids, train=False)["params"]

  def features(self, params, images):
    """The images' normalised embeddings."""
    return self.model.apply({"params": params}, images,
                            method=self.model.embed_images)

  def text_features(self, params, token_ids):
    """The texts' normalised embeddings [N, D] of token ids [N, length]."""
    return self.model.apply({"params": params}, token_ids,
                            method=self.model.embed_texts)

  def prepare(self, batch, step):
    """The images, and each one's caption's token ids: the input
    pipeline's, or, captioning labels, row r of step s's batch draws among
    its class's captions from (seed, CAPTION_STREAM, s, r)."""
    kept = {key: batch[key] for key in ("image", "mask", "grid")
            if key in batch}
    if "tokens" in batch:
      return {**kept, "tokens": batch["tokens"]}
    labels = batch["label"]
    key = self.stream(CAPTION_STREAM, step)
    draws = jax.vmap(lambda row: jax.random.uniform(
        jax.random.fold_in(key, row)))(jnp.arange(labels.shape[0]))
    counts = jnp.asarray(self.caption_counts)[labels]
    choice = jnp.minimum((draws * counts).astype(jnp.int32), counts - 1)
    return {**kept, "tokens": jnp.asarray(self.caption_ids)[labels, choice]}

  def loss(self, params, micro, weights, key):
    embedded = self.model.apply(
        {"params": params}, naflex.inputs_of(micro), micro["tokens"],
        train=True, rngs={"dropout": key})
    valid = micro["mask"]
    if self.loss_kind == "softmax":
      per_image = contrastive.softmax_losses(
          embedded.images, embedded.texts, embedded.scale, valid)
    else:
      losses = (contrastive.chunked_sigmoid_losses if self.chunked
                else contrastive.sigmoid_losses)
      per_image = losses(embedded.images, embedded.texts, embedded.scale,
                         embedded.bias, valid)
    share = weights.sum()  # of the batch: the parts add up to its mean
    return (weights * per_image).sum(), {
        "temperature": share * embedded.scale, "bias": share * embedded.bias}

  def flops_per_image(self, image_size, num_patches=None, slots=1):
    """Both towers' training step, and the image's logits against every
    text of its micro-batch."""
    del slots
    return flops.two_towers_flops(
        self.model, image_size, self.keys.image_text.text_length,
        self.batch_size,
        num_patches) * flops.TRAIN_FORWARDS


def two_towers_of(source):
  """(TwoTowers model, its params) of `source`: a workdir of an
  image_text run (DIR or DIR:STEP; what it serves), transformers'
  SiglipModel or Siglip2Model directory (weights/pytorch/siglip.py), or
  big_vision's two-tower .npz (weights/big_vision.py), local, a URL or
  hf://ORG/NAME."""
  read = pretrained.two_towers_in(source)
  if read is not None:
    return read.model, read.params
  keys, params = base.run_of(source, "image_text",
                             "a transformers SiglipModel directory")
  return model_of(keys), params


def class_embeddings(embed_texts, tokenizer, templates, class_names):
  """[classes, D]: each class's captions (every template with every one of
  its names, data/captions.py) through `embed_texts` (token ids [n,
  length] -> normalised embeddings [n, D]), averaged and normalised
  again: what zero-shot classification compares images with."""
  captions = captions_lib.of_classes(templates, class_names)
  texts = [text for texts in captions for text in texts]
  embedded = np.asarray(embed_texts(tokenizer.encode(texts)), np.float32)
  ends = np.cumsum([len(texts) for texts in captions])
  means = np.stack([embedded[end - len(texts):end].mean(axis=0)
                    for end, texts in zip(ends, captions)])
  return means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True),
                            1e-12)


# The tokenizer file a transformers SiglipModel directory may hold beside
# its weights (its tokenizer's save_pretrained writes spiece.model).
TOKENIZER_FILES = ("spiece.model", "tokenizer.model")


def tokenizer_for(source, length, given=""):
  """The tokenizer of two-tower `source` at `length` tokens: `given` (a
  SentencePiece file), else a workdir's run's (config.image_text's), else
  the file a SiglipModel directory holds (TOKENIZER_FILES)."""
  if given:
    return tokenizer_lib.Tokenizer.read(given, length)
  path = pretrained.local(source).path
  if pytorch_siglip.is_two_towers(path):
    for name in TOKENIZER_FILES:
      if paths.path(paths.join(path, name)).exists():
        return tokenizer_lib.Tokenizer.read(paths.join(path, name), length)
    raise errors.InputError(
        f"{source} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): "
        "give its SentencePiece model with --tokenizer")
  directory, _ = pretrained.parse_source(source)
  return tokenizer_of(Workdir(directory).read_config())


class ZeroShotClassifier:
  """A two-tower source's zero-shot classifier of `class_names` (each
  class's captions, `templates` with its names, through the text tower:
  `class_embeddings`). `logits(images)`: [images, classes], t * cosine +
  b, whose sigmoid is SigLIP's probability that an image shows a class.
  `image_size`: the side its image tower was trained at. `tokenizer`: a
  SentencePiece file, where the source holds none (`tokenizer_for`).
  `function()`: the same as an export's function (vit_jax.export
  --class_names), the class embeddings baked in."""

  def __init__(self, source, class_names, templates, tokenizer=""):
    self.source = source
    self.class_names = list(class_names)
    self.model, self.params = two_towers_of(source)
    image = flax.traverse_util.flatten_dict(self.params["img"], sep="/")
    table = np.shape(image[models.POSEMB_KEY])[1] - models.posemb_prefix(
        image)
    self.image_size = models.grid_side(table, models.POSEMB_KEY) * np.shape(
        image["embedding/kernel"])[0]
    length = np.shape(self.params["txt"]["Transformer"]["posembed_input"][
        "pos_embedding"])[1]
    embed = jax.jit(lambda params, ids: self.model.apply(
        {"params": params}, ids, method=self.model.embed_texts))
    self.classes = class_embeddings(
        lambda ids: embed(self.params, ids),
        tokenizer_for(source, length, tokenizer), templates, class_names)
    self.templates = list(templates)

  def _weights(self):
    """What the image side reads: the image tower, t, b and the classes."""
    return {"img": self.params["img"], "t": self.params["t"],
            "b": self.params["b"], "classes": self.classes}

  def _infer(self, weights, images):
    """(logits, image embeddings, sigmoid probabilities) of `images`."""
    towers = {key: weights[key] for key in ("img", "t", "b")}  # No text.
    embedded = self.model.apply({"params": towers}, images,
                                method=self.model.embed_images)
    logits = (embedded @ weights["classes"].T * jnp.exp(weights["t"][0])
              + weights["b"][0])
    return logits, embedded, jax.nn.sigmoid(logits)

  def logits(self, images):
    return np.asarray(jax.jit(self._infer)(self._weights(), images)[0])

  def function(self):
    """The classifier as vit_jax.export writes it (a
    function_exports.Function): uint8 pixels at image_size in; the
    logits, the image embedding and SigLIP's probabilities out."""
    weights = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32),
                           self._weights())
    return function_exports.Function(
        functools.partial(self._infer, weights), weights, self.image_size,
        1.0, f"{self.source}, zero-shot over {len(self.class_names)} "
        f"classes through {len(self.templates)} templates",
        outputs=dict(ZERO_SHOT_OUTPUTS))


# What an export of a ZeroShotClassifier gives (function_exports.OUTPUTS:
# a classifier's).
ZERO_SHOT_OUTPUTS = {
    "logits": "float32 [batch, classes]: t * cosine(image, class) + b, the "
              "class's text embedding the mean of its captions'",
    "pre_logits": "float32 [batch, width]: the image embedding, unit length",
    "probabilities": "float32 [batch, classes]: the sigmoid of the logits, "
                     "each class's on its own (SigLIP's)",
}


def contrastive_logits(source, images, token_ids):
  """[images, texts] float32: t * <image, text> + b of every image (NHWC,
  in [-1, 1]) against every text (token ids [texts, length], the
  source's length) by the two towers of `source` (`two_towers_of`):
  transformers' SiglipModel(...).logits_per_image for its directory."""
  model, params = two_towers_of(source)
  return model.apply({"params": params}, images, token_ids,
                     train=False).logits()
