"""What a trained ViT has learned, as in Section 4.5 of the paper.

The numbers behind Figures 6 and 7 (attention rollout, mean attention
distance per layer and head, position-embedding similarity, principal
components of the patch-embedding filters), computed here and checked by
the tests; vit_jax/analysis/plots.py draws them, and `write_all` writes every
figure of a model (with the patch features' principal components of
vit_jax/analysis/components.py). `python -m vit_jax.figures` is the command
line.
"""

import dataclasses
import functools
import re

import flax
import jax
import numpy as np

from vit_jax import errors, models, paths
from vit_jax.analysis import classify, components, plots, reconstructions
from vit_jax.data import image_files as images_lib
from vit_jax.models import naflex, positions, tokens as tokens_lib
from vit_jax.runs import writers


def attention_weights(model, params, images):
  """(logits [N, classes], attention [layers, N, heads, tokens, tokens]) of
  `model` on `images`, as numpy, from the weights the model sows."""
  logits, state = _sowing_apply(model)(params, images)
  return np.asarray(logits), _per_layer(state["intermediates"])


def attention_summary(model, params, inputs, rollout_count, batch_size=8):
  """(logits [N, classes], mean attention distance [layers, heads] over all
  images, the rollout maps of the first `rollout_count`: a list of [rows,
  cols] arrays, one per image).

  inputs: square images [N, H, W, 3], or a NaFlex batch (models/naflex.py),
  whose images each have their own grid; each image's numbers come from
  its real patches only. A batch at a time: the attention of a large model
  over many images (layers x heads x tokens^2 each) would not fit in host
  memory at once.
  """
  token = model.config.classifier == "token"
  # A distillation token is left out as the registers are: the maps are
  # the class token's, the distances the patches'.
  registers = model.config.num_prefix_tokens - token
  grids = patch_grids(model, inputs)
  logits, distance_sum, maps = [], 0, []
  for start in range(0, len(grids), batch_size):
    batch = jax.tree.map(lambda x: x[start:start + batch_size], inputs)
    batch_logits, attention = attention_weights(model, params, batch)
    logits.append(batch_logits)
    for i, (rows, cols) in enumerate(grids[start:start + batch_size]):
      # The image's own; padding follows.
      tokens = token + registers + rows * cols
      own = attention[:, i:i + 1, :, :tokens, :tokens]
      distance_sum = distance_sum + mean_attention_distance(
          own, (rows, cols), model.token_stride, token, registers)
      if start + i < rollout_count:
        maps.append(attention_rollout(own, token, (rows, cols),
                                      registers)[0])
  return np.concatenate(logits), distance_sum / len(grids), maps


def patch_grids(model, inputs):
  """[N, 2]: each image's (rows, cols) of patches, for square images or a
  NaFlex batch."""
  if isinstance(inputs, naflex.Patches):
    return np.asarray(inputs.grid)
  side = inputs.shape[1] // model.token_stride
  return np.full((len(inputs), 2), side)


def pictures(model, inputs):
  """The images as the model sees them, for showing: square images as they
  are; a NaFlex batch's patches put back together, each image [rows * p,
  cols * p, 3] at its resized shape."""
  if not isinstance(inputs, naflex.Patches):
    return list(inputs)
  p = model.config.patch_size
  return [
      np.asarray(pixels[:rows * cols]).reshape(rows, cols, p, p, 3)
      .transpose(0, 2, 1, 3, 4).reshape(rows * p, cols * p, 3)
      for pixels, (rows, cols) in zip(inputs.pixels, np.asarray(inputs.grid))]


@functools.lru_cache(maxsize=4)
def _sowing_apply(model):
  # Only the einsum attention keeps its weights; the function is the same.
  model = model.clone(config=dataclasses.replace(model.config,
                                                 attention="einsum"))
  return jax.jit(lambda params, images: model.apply(
      {"params": params}, images, train=False, mutable="intermediates"))


_LAYER = re.compile(r"encoderblock_(\d+)")


def _per_layer(intermediates):
  """The sown attention weights, stacked in layer order."""
  flat = flax.traverse_util.flatten_dict(intermediates, sep="/")
  by_layer = {}
  for key, (value,) in flat.items():
    if key.endswith("/attention_weights"):
      by_layer[int(_LAYER.search(key).group(1))] = np.asarray(value)
  return np.stack([by_layer[i] for i in range(len(by_layer))])


def attention_rollout(attentions, class_token=True, grid=None,
                      num_registers=0):
  """Attention rollout (Abnar & Zuidema, 2020): how much each patch feeds the
  output through all layers, [N, rows, cols] (a square grid unless `grid`
  gives its (rows, cols)).

  attentions: [layers, N, heads, tokens, tokens]. Per layer the heads are
  averaged, the identity added for the residual connection and the rows
  renormalised; the layers' matrices are then multiplied, first layer on
  the right. The map is the class token's row (class_token=True), or for a
  GAP model the mean of the patches' rows, over the patches: the
  `num_registers` registers after the class token take part in the
  product but are no row or column of the map.
  """
  mixed = attentions.mean(axis=2) + np.eye(attentions.shape[-1])
  mixed /= mixed.sum(axis=-1, keepdims=True)
  rollout = mixed[0]
  for layer in mixed[1:]:
    rollout = layer @ rollout
  prefix = int(class_token) + num_registers
  if class_token:
    patches = rollout[:, 0, prefix:]
  else:
    patches = rollout[:, prefix:, prefix:].mean(axis=1)
  if grid is None:
    grid = (models.grid_side(patches.shape[-1]),) * 2
  return patches.reshape(-1, *grid)


def mean_attention_distance(attentions, grid_size, patch_size,
                            class_token=True, num_registers=0):
  """[layers, heads]: the attention-weighted mean distance in pixels between
  a query patch's centre and its key patches' centres, averaged over query
  patches and images.

  attentions: [layers, N, heads, tokens, tokens], over a grid of
  grid_size x grid_size patches, or of (rows, cols). The class token and
  the `num_registers` registers after it are left out as queries and as
  keys; each query's weights on the patches are renormalised to sum to
  one.
  """
  prefix = int(class_token) + num_registers
  attentions = attentions[..., prefix:, prefix:]
  weights = attentions / attentions.sum(axis=-1, keepdims=True)
  height, width = np.broadcast_to(grid_size, 2)
  rows, cols = np.divmod(np.arange(height * width), width)
  centres = np.stack([rows, cols], axis=-1) * patch_size
  distance = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
  per_query = (weights * distance).sum(axis=-1)  # [layers, N, heads, queries]
  return per_query.mean(axis=(1, 3))


def position_table(model, params, image_size):
  """[1, tokens, D]: what `model` adds to the tokens at each position at
  `image_size`, whatever its kind of position embedding; None for "none"."""
  if model.config.posemb == "none":
    return None
  grid = image_size // model.token_stride
  tokens = grid * grid + model.config.embedded_prefix_tokens
  module = positions.AddPositionEmbedding(model.config.posemb)
  variables = {"params": params["Transformer"].get("posembed_input", {})}
  return np.asarray(module.apply(variables, tokens_lib.of_grid(
      np.zeros((1, tokens, model.config.hidden_size), np.float32),
      (grid, grid))))


def position_similarity(posemb, extra=1):
  """[grid, grid, grid, grid]: cosine similarity between the position
  embedding of patch (i, j) and that of patch (k, l).

  posemb: [1, extra + tokens, D], the `extra` rows of the class (and
  distillation) tokens first.
  """
  grid_embeddings = posemb[0, extra:]
  unit = grid_embeddings / np.linalg.norm(grid_embeddings, axis=-1,
                                          keepdims=True)
  grid = models.grid_side(len(unit))
  return (unit @ unit.T).reshape(grid, grid, grid, grid)


def embedding_components(kernel, count=28):
  """The principal components of the patch-embedding filters.

  kernel: [patch, patch, 3, D], D filters. Returns (components [k, patch,
  patch, 3], the fraction of the filters' variance each explains [k]), with
  k = min(count, D, patch * patch * 3), largest first.
  """
  patch = kernel.shape[0]
  filters = kernel.reshape(-1, kernel.shape[-1]).T  # [D, patch * patch * 3]
  filters = filters - filters.mean(axis=0)
  _, singular, directions = np.linalg.svd(filters, full_matrices=False)
  variance = singular**2
  count = min(count, len(variance))
  return (directions[:count].reshape(count, patch, patch, 3),
          variance[:count] / variance.sum())


def uniform_distance(grids, patch_size):
  """The mean attention distance in pixels of attention spread evenly over
  each image's patches, averaged over the images' (rows, cols) `grids`."""
  shapes, counts = np.unique(np.asarray(grids), axis=0, return_counts=True)
  distances = [
      mean_attention_distance(
          np.full((1, 1, 1, rows * cols, rows * cols), 1 / (rows * cols)),
          (rows, cols), patch_size, False)[0, 0]
      for rows, cols in shapes]
  return float(np.average(distances, weights=counts))


def describe(model, resolution):
  config = model.config
  return (f"{config.num_layers} layers x {config.num_heads} heads, width "
          f"{config.hidden_size}, {model.describe_patch()}, {resolution}")


def sample_images(inference, paths, count, dataset, split, data_dir,
                  budget=None):
  """(images, labels or None, where from) for the attention figures: the
  files `paths` name, or else the first images of `dataset`'s `split`;
  square at the model's resolution, or with a NaFlex `budget`
  (models.naflex.Budget) each at its own aspect ratio."""
  size, crop = inference.image_size, inference.crop_fraction
  if paths:
    files = images_lib.expand(paths)[:count]
    images = (images_lib.naflex_from_files(files, budget) if budget else
              images_lib.from_files(files, size, crop))
    return images, None, f"{len(files)} images from {', '.join(paths)}"
  if not dataset:
    raise errors.InputError(
        "the attention figures need images: give --images or "
        "--dataset")
  images, labels = images_lib.from_dataset(dataset, split, count, size, crop,
                                           data_dir, budget)
  return images, labels, f"the first {len(labels)} of {dataset} {split}"


def write_all(inference, out, samples, names=None, rollout_images=8,
              workdir=None):
  """Writes every figure into `out` (a folder, local or a URL such as
  `gs://BUCKET/figures`) and returns their paths.

  samples: (images, labels or None, a line saying where they come from), as
  `sample_images` gives; names: class names for the captions, or None.
  The training curves need the run's `workdir`.
  """
  model, params, size = inference.model, inference.params, inference.image_size
  images, labels, source = samples
  grids = patch_grids(model, images)
  if isinstance(images, naflex.Patches):
    title = describe(model, f"at most {images.pixels.shape[1]} patches")
  else:
    title = describe(model, f"{size}px")
  # Made first, so that a folder that cannot be made fails before the
  # model runs; a bucket has no folders to make.
  if not paths.is_url(out):
    paths.path(out).mkdir(parents=True, exist_ok=True)
  written = []

  def path(name):
    written.append(paths.join(out, name))
    return written[-1]

  if model.config.resnet_stages is None:  # A hybrid's embeds feature maps.
    plots.embedding_filters(
        *embedding_components(params["embedding"]["kernel"]), title,
        path("embedding_filters.png"))
  posemb = position_table(model, params, size)
  if posemb is not None:
    plots.position_similarity(
        position_similarity(posemb, model.config.embedded_prefix_tokens),
        title, path("position_embedding_similarity.png"))

  logits, distances, maps = attention_summary(model, params, images,
                                              rollout_images)
  plots.attention_distance(
      distances, uniform_distance(grids, model.token_stride),
      int(grids.max()) * model.token_stride, f"{title}\nover {source}",
      path("mean_attention_distance.png"))
  # A headless source (its features only) names no class.
  captions = [caption(logits[i], names, None if labels is None else labels[i])
              if logits.shape[-1] else "" for i in range(len(maps))]
  plots.attention_rollout(pictures(model, images)[:len(maps)], maps, captions,
                          title, path("attention_rollout.png"),
                          labels is not None)

  if not isinstance(images, naflex.Patches):
    shown = images[:rollout_images]
    colours, shares = components.as_colours(
        components.patch_features(model, params, shown))
    plots.patch_components(pictures(model, shown), colours, shares, title,
                           path("patch_components.png"))
  if workdir:
    plots.training_curves(writers.read_rows(workdir), workdir,
                            path("training_curves.png"))
  if workdir and reconstructions.is_mae_run(workdir) and not isinstance(
      images, naflex.Patches):
    shown, losses = reconstructions.of_run(
        workdir, np.stack(pictures(model, images)[:rollout_images]))
    plots.reconstructions(shown, losses, title, path("reconstructions.png"))
  return written


def caption(logits, names, label=None):
  """'7 (0.98)': the prediction and its probability; with the label when
  known, '1 -> 7 (0.98)'."""
  probs = np.asarray(jax.nn.softmax(logits))[None]
  ((_, name, probability),) = classify.top_classes(probs, 1, names)[0]
  text = f"{name} ({probability:.2f})"
  if label is None:
    return text
  return f"{classify.class_name(names, int(label))} -> {text}"
