"""Draws vit_jax.figures's numbers as PNGs (matplotlib, no display needed).

Each function takes numbers that vit_jax.figures computed, a title line
naming the model, and the path to write: local or a URL (`gs://...`),
replaced whole when the figure is complete.
"""

import matplotlib
import numpy as np

# Figures without pyplot: PNG files only, no display (a TPU VM, CI), and no
# backend chosen for the rest of the process.
from matplotlib.figure import Figure

from vit_jax import paths
from vit_jax.training.reporting import goodput

DPI = 100


def _subplots(*grid, figsize, layout=None, **kwargs):
  figure = Figure(figsize=figsize, layout=layout)
  return figure, figure.subplots(*grid, **kwargs)


def _save(figure, path):
  # matplotlib writes local files: into a temporary one, then put in place
  # (uploaded, for a URL). Its name does not end in the target's suffix,
  # so the format is named.
  format_ = paths.path(path).suffix.lstrip(".").lower() or "png"
  with paths.writing(path) as local:
    figure.savefig(local, dpi=DPI, bbox_inches="tight", format=format_)


def embedding_filters(components, explained, title, path):
  """Principal components of the patch-embedding filters, each scaled to
  [0, 1] on its own and shown as an RGB patch (Fig. 7, left)."""
  count = len(components)
  cols = min(count, 7)
  rows = -(-count // cols)
  figure, axes = _subplots(rows, cols, figsize=(1.1 * cols, 1.1 * rows + 0.6),
                           squeeze=False, layout="constrained")
  for i, ax in enumerate(axes.flat):
    ax.axis("off")
    if i >= count:
      continue
    c = components[i]
    ax.imshow((c - c.min()) / max(c.max() - c.min(), 1e-12),
              interpolation="nearest")
    ax.set_title(f"PC{i + 1}: {100 * explained[i]:.0f}%", fontsize=8)
  figure.suptitle(f"Patch-embedding filters: principal components (RGB) and "
                  f"the variance each explains\n{title}", fontsize=9)
  _save(figure, path)


def position_similarity(similarity, title, path):
  """The grid of grids of Fig. 7 (centre): tile (i, j) shows the cosine
  similarity of patch (i, j)'s position embedding with every patch's."""
  grid = similarity.shape[0]
  step = grid + 1  # One blank pixel between tiles.
  mosaic = np.full((grid * step - 1, grid * step - 1), np.nan)
  for i in range(grid):
    for j in range(grid):
      mosaic[i * step:i * step + grid, j * step:j * step + grid] = (
          similarity[i, j])
  # Large enough that each position keeps a pixel or more of its own.
  side = max(4.5, 0.3 * grid + 1.5)
  figure, ax = _subplots(figsize=(side + 0.8, side))
  image = ax.imshow(mosaic, cmap="viridis", vmin=-1, vmax=1,
                    interpolation="nearest")
  ticks = np.arange(grid) * step + (grid - 1) / 2
  labels = [str(k + 1) if grid <= 16 or k % 2 == 0 else ""
            for k in range(grid)]
  ax.set_xticks(ticks, labels, fontsize=7)
  ax.set_yticks(ticks, labels, fontsize=7)
  ax.tick_params(length=0)
  ax.set_xlabel("Input patch column")
  ax.set_ylabel("Input patch row")
  figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04,
                  label="Cosine similarity")
  ax.set_title(f"Position embedding similarity\n{title}", fontsize=9)
  _save(figure, path)


def attention_distance(distances, uniform, image_size, title, path):
  """Mean attention distance against depth, one dot per head (Fig. 7,
  right). distances: [layers, heads] in pixels; uniform: the distance of
  attention spread evenly over the patches, drawn as a reference;
  image_size: the longest side in pixels, the axis's top."""
  layers, heads = distances.shape
  figure, ax = _subplots(figsize=(5.6, 4))
  colours = matplotlib.colormaps["tab20" if heads > 10 else "tab10"]
  for head in range(heads):
    ax.scatter(np.arange(1, layers + 1), distances[:, head], s=18,
               color=colours(head % colours.N),
               label=f"Head {head + 1}" if heads <= 8 else None)
  ax.axhline(uniform, color="grey", linestyle="--", linewidth=1,
             label="uniform attention")
  ax.set_xlabel("Network depth (layer)")
  ax.set_ylabel("Mean attention distance (pixels)")
  ax.set_xlim(0.5, layers + 0.5)
  ax.set_xticks(np.arange(1, layers + 1, max(1, layers // 12)))
  ax.set_ylim(0, image_size)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=3, loc="upper left", frameon=False)
  ax.set_title(f"Mean attention distance\n{title}", fontsize=9)
  _save(figure, path)


def attention_rollout(images, maps, captions, title, path, labelled=False):
  """Fig. 6: each image over the attention its output draws from, through
  all layers; maps [N, grid, grid] are scaled to a maximum of 1 each and
  upsampled to the image, whose pixels they weight. Captions name the
  prediction, after the label when `labelled`. Images and maps may each
  have their own shape (NaFlex: [rows, cols] maps over images of rows x
  cols patches)."""
  count = len(images)
  figure, axes = _subplots(2, count, figsize=(1.5 * count + 0.2, 3.4),
                           squeeze=False, layout="constrained")
  for i in range(count):
    weight = _upsample(maps[i] / maps[i].max(), images[i].shape[:2])
    axes[0, i].imshow(images[i], interpolation="nearest")
    axes[1, i].imshow((images[i] * weight[..., None]).astype(np.uint8),
                      interpolation="nearest")
    axes[0, i].set_title(captions[i], fontsize=7)
    for ax in axes[:, i]:
      ax.set_xticks([])
      ax.set_yticks([])
  axes[0, 0].set_ylabel("Input", fontsize=8)
  axes[1, 0].set_ylabel("Attention", fontsize=8)
  above = ("its label -> the prediction (probability)" if labelled else
           "the prediction (probability)")
  figure.suptitle(f"Attention rollout; above each image: {above}\n{title}",
                  fontsize=9)
  _save(figure, path)


def reconstructions(pictures, losses, title, path):
  """A masked autoencoder's work (analysis/reconstructions.py): pictures
  [4, N, H, W, 3] uint8, a row each (the images, their visible patches,
  the reconstruction, it with the visible patches), and each image's
  reconstruction loss over its removed patches above it."""
  count = pictures.shape[1]
  figure, axes = _subplots(4, count, figsize=(1.5 * count + 0.2, 6.4),
                           squeeze=False, layout="constrained")
  for row, name in enumerate(("Input", "Visible", "Reconstruction",
                              "Reconstruction\n+ visible")):
    for i in range(count):
      axes[row, i].imshow(pictures[row, i], interpolation="nearest")
      axes[row, i].set_xticks([])
      axes[row, i].set_yticks([])
    axes[row, 0].set_ylabel(name, fontsize=8)
  for i in range(count):
    axes[0, i].set_title(f"loss {losses[i]:.3f}", fontsize=7)
  figure.suptitle(f"Masked autoencoder: held-out images; above each, the "
                  f"loss on its removed patches\n{title}", fontsize=9)
  _save(figure, path)


def patch_components(images, colours, shares, title, path):
  """DINOv2's figure: each image [H, W, 3] uint8 above its patches'
  first three principal components as red, green and blue (colours [N,
  rows, cols, 3] in [0, 1], analysis/components.py), each patch a block of
  its pixels; `shares`: each component's share of the variance."""
  count = len(images)
  figure, axes = _subplots(2, count, figsize=(1.5 * count + 0.2, 3.4),
                           squeeze=False, layout="constrained")
  for i in range(count):
    height, width = images[i].shape[:2]
    rows, cols = colours[i].shape[:2]
    blocks = np.repeat(np.repeat(colours[i], height // rows, 0),
                       width // cols, 1)
    axes[0, i].imshow(images[i], interpolation="nearest")
    axes[1, i].imshow(blocks, interpolation="nearest")
    for ax in axes[:, i]:
      ax.set_xticks([])
      ax.set_yticks([])
  axes[0, 0].set_ylabel("Input", fontsize=8)
  axes[1, 0].set_ylabel("Components", fontsize=8)
  explained = ", ".join(f"{share:.0%}" for share in shares)
  figure.suptitle(f"Patch features' first principal components as red, "
                  f"green, blue (of the variance: {explained})\n{title}",
                  fontsize=9)
  _save(figure, path)


def _upsample(grid_map, shape):
  """Bilinear upsampling of a [rows, cols] map to `shape` (height, width),
  sampling the pixel centres."""

  def taps(grid, size):
    coords = np.clip((np.arange(size) + 0.5) * grid / size - 0.5, 0, grid - 1)
    low = np.floor(coords).astype(int)
    return low, np.minimum(low + 1, grid - 1), coords - low

  low, high, frac = taps(grid_map.shape[0], shape[0])
  rows = (grid_map[low] * (1 - frac)[:, None] + grid_map[high] * frac[:, None])
  low, high, frac = taps(grid_map.shape[1], shape[1])
  return rows[:, low] * (1 - frac) + rows[:, high] * frac


# (panel title, y label, metric names or a suffix of them, log scale)
CURVES = (
    ("Loss", "cross-entropy", ("train_loss",), True),
    ("Learning rate", "learning rate", ("learning_rate",), False),
    ("Accuracy", "top-1", ("accuracy",), False),
    ("Throughput", "images / s / device", ("img_per_sec_per_device",), False),
    ("Cost", "core-days", ("core_days",), False),  # By bucket when logged.
    ("Gradient norm", "global norm", ("grad_norm",), True),
)


def training_curves(rows, run_name, path):
  """Six panels of a run's metrics.jsonl rows against the step: loss,
  learning rate, every *accuracy metric, throughput, core-days (stacked by
  where the time went, when the rows have its buckets), gradient norm.
  Panels of metrics the run did not log are left empty and say so."""
  figure, axes = _subplots(2, 3, figsize=(10.5, 5.6))
  names = sorted({key for row in rows for key in row if key != "step"})
  for ax, (panel, unit, wanted, log_scale) in zip(axes.flat, CURVES):
    drawn = [name for name in names
             if name in wanted or name.endswith(wanted)]
    buckets = [name for name in names
               if name.startswith(goodput.METRIC_PREFIX)]
    if panel == "Cost" and buckets and "core_days" in drawn:
      _stack_core_days(ax, rows, buckets)
    else:
      for name in drawn:
        steps = [row["step"] for row in rows if name in row]
        values = [row[name] for row in rows if name in row]
        ax.plot(steps, values, marker="o" if len(steps) < 20 else None,
                markersize=3, label=name)
    if not drawn:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center",
              transform=ax.transAxes, color="grey")
    elif log_scale:
      ax.set_yscale("log")
    if drawn and (len(drawn) > 1 or panel == "Accuracy"):
      ax.legend(fontsize=7, frameon=False)
    ax.set_title(panel, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel(unit, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
  figure.suptitle(f"Training curves: {run_name}", fontsize=10)
  figure.tight_layout()
  _save(figure, path)


def _stack_core_days(ax, rows, buckets):
  """The core-days of each row, as areas of the buckets that hold them
  (the rows' seconds, in the proportion that core_days has to them)."""
  rows = [row for row in rows if "core_days" in row and buckets[0] in row]
  steps = [row["step"] for row in rows]
  seconds = np.array([[row.get(b, 0.0) for row in rows] for b in buckets])
  total = seconds.sum(axis=0)
  per_second = np.array([row["core_days"] for row in rows]) / np.maximum(
      total, 1e-12)
  ax.stackplot(steps, seconds * per_second,
               labels=[b[len(goodput.METRIC_PREFIX):] for b in buckets])
  ax.legend(fontsize=6, frameon=False, loc="upper left", ncol=2)
