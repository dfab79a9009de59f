"""Muon (Jordan et al. 2024: momentum orthogonalised by Newton-Schulz
iterations) on a ViT's matrices, AdamW on the rest: config.optimizer.name
"muon".

Which parameters are matrices, and which matrices, is the point: Muon
orthogonalises each matrix of a linear map, so

  - an attention projection's kernel [width, heads, head_dim] (query, key,
    value; out is [heads, head_dim, width]) is one matrix width x
    (heads * head_dim): each projection on its own, never the three
    together as one fused qkv matrix; with muon_per_head, each head's
    slice is a matrix of its own (the heads a batch axis);
  - an MLP's kernel [in, out] is one matrix;
  - a scanned model's stack of blocks (scan_layers) puts the layer first,
    [layers, ...]: a batch axis, each block's matrix orthogonalised alone;
  - everything else goes to AdamW: the patch embedding (a convolution over
    pixels), the position embeddings and tokens, norms, biases, a pooling
    head (MAP) and the classifier head, as Muon's authors and timm do.

The blocks are any transformer's of the model: the image encoder's
(`Transformer/encoderblock...`), a text tower's or a decoder's beneath
their own prefix (`txt/Transformer/...`).

Newton-Schulz, the momentum and their dimension numbers are optax's
(`optax.contrib.scale_by_muon`, `MuonDimensionNumbers`); the scaling of
each update by its matrix's shape is optax.contrib.muon's, written here
(optax keeps it private). Under FSDP and tensor parallelism the iterations
multiply sharded matrices: XLA partitions the products and gathers what
each needs, and the update is the one device's (tests/test_optim.py).
"""

import math
import re

import jax
import numpy as np
import optax
from optax import contrib

MUON, ADAM = "muon", "adam"
# A block's kernels, at any depth of the tree: Transformer/encoderblock_3/,
# or a scanned stack's Transformer/encoderblock/.
_BLOCK = re.compile(r"(?:^|/)Transformer/encoderblock(?:_\d+)?/")
_ATTENTION = ("query", "key", "value")


def dimension_numbers(name, ndim, per_head=False):
  """The MuonDimensionNumbers of parameter `name` ("Transformer/
  encoderblock_0/MlpBlock_3/Dense_0/kernel") of `ndim` axes, or None where AdamW trains it. A
  scanned stack's leading layer axis is left out of both: a batch axis."""
  if not _BLOCK.search(name) or not name.endswith("/kernel"):
    return None
  module = name.split("/")[-2]
  if module in _ATTENTION:  # [..., width, heads, head_dim]
    axes = _last(ndim, 3)
    return contrib.MuonDimensionNumbers(
        reduction_axis=axes[0],
        output_axis=axes[2] if per_head else (axes[1], axes[2]))
  if module == "out":  # [..., heads, head_dim, width]
    axes = _last(ndim, 3)
    return contrib.MuonDimensionNumbers(
        reduction_axis=axes[1] if per_head else (axes[0], axes[1]),
        output_axis=axes[2])
  if ndim >= 2:  # An MLP's [..., in, out].
    axes = _last(ndim, 2)
    return contrib.MuonDimensionNumbers(reduction_axis=axes[0],
                                        output_axis=axes[1])
  return None


def _last(ndim, count):
  return tuple(range(ndim - count, ndim))


def labels(params, name_of, per_head=False):
  """MUON or ADAM for each parameter of `params`; `name_of`: a tree path's
  parameter name (optimizer.parameter_name)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: ADAM if dimension_numbers(
          name_of(path), len(np.shape(leaf)), per_head) is None else MUON, params)


def _dimensions(name_of, per_head):
  """The dimension numbers of the Muon parameters of a (masked) tree."""
  def of(tree):
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: dimension_numbers(name_of(path), len(np.shape(leaf)),
                                             per_head), tree)
  return of


def _fans(shape, dims):
  """(fan_in, fan_out) of a matrix of `dims` in an array of `shape`."""
  axes = lambda a: (a,) if isinstance(a, int) else tuple(a)
  return (math.prod(shape[a] for a in axes(dims.reduction_axis)),
          math.prod(shape[a] for a in axes(dims.output_axis)))


def scale_by_shape(dimensions, consistent_rms):
  """Each orthogonalised update times its matrix's shape factor: with
  `consistent_rms` r > 0, r * sqrt(max(fan_in, fan_out)), which gives the
  update an RMS of r, AdamW's typical one (Liu et al. 2025); with 0,
  sqrt(max(1, fan_out / fan_in)) (Jordan's). optax.contrib.muon's."""
  def update(updates, state, params=None):
    del params

    def scaled(update, dims):
      fan_in, fan_out = _fans(update.shape, dims)
      factor = (consistent_rms * math.sqrt(max(fan_in, fan_out))
                if consistent_rms else math.sqrt(max(1, fan_out / fan_in)))
      return update * factor
    return jax.tree.map(scaled, updates, dimensions(updates),
                        is_leaf=lambda x: isinstance(
                            x, contrib.MuonDimensionNumbers)), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                      update)


def transform(opt, mu_dtype, adam, decay_mask, name_of):
  """Muon on the blocks' matrices, `adam` (AdamW's transformations, up to
  the learning rate) on the rest; both then share the schedule. The AdamW
  part's rate is adam_learning_rate / learning_rate of the Muon part's.
  `decay_mask`: the parameters weight decay shrinks (the kernels);
  `name_of`: a tree path's parameter name."""
  dimensions = _dimensions(name_of, opt.muon_per_head)
  muon = [contrib.scale_by_muon(
      beta=opt.muon_beta, mu_dtype=mu_dtype, adaptive=opt.muon_adaptive,
      preconditioning=opt.muon_preconditioning,
      weight_dimension_numbers=dimensions),
          scale_by_shape(dimensions, opt.muon_consistent_rms)]
  if opt.weight_decay:
    muon.append(optax.add_decayed_weights(opt.weight_decay, mask=decay_mask))
  ratio = (1.0 if opt.adam_learning_rate is None or not opt.learning_rate
           else opt.adam_learning_rate / opt.learning_rate)
  if ratio != 1.0:
    adam = [*adam, optax.scale(ratio)]
  return optax.partition(
      {MUON: optax.chain(*muon), ADAM: optax.chain(*adam)},
      lambda params: labels(params, name_of, opt.muon_per_head))
