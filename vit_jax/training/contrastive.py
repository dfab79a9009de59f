"""The losses of image-text pairs: SigLIP's sigmoid loss (Zhai et al., ICCV
2023), dense and chunked over devices, and CLIP's softmax loss.

Row i of the images goes with row i of the texts; every other pairing is
a negative. Embeddings are L2-normalised; a pair's logit is
scale * <image, text> + bias (models/two_towers.py).

The sigmoid loss of image i is the sum over texts j of -log sigmoid(z_ij
* logit_ij), z_ij = 1 on the diagonal and -1 elsewhere; big_vision
reduces it to the mean over images of that sum (`sigmoid_loss`). Each
function here gives each image's term, [N], so that the step can weigh
the images (training/step.py: a broken record's row weighs 0) and add
micro-batches up; `valid` [N] leaves texts out as negatives (a broken
record's row).

Chunked (`chunked_sigmoid_losses`), as the SigLIP paper's Section 3.3
describes: inside the jitted step, each device scores its own images
against the texts it holds, then hands those texts on to its neighbour
over the batch's mesh axes (shard_map and ppermute, a ring over data and
fsdp, across hosts and slices) and scores the next block, until every
block has passed every device. No device ever holds more than its rows x
its rows of logits, where the dense loss's batch x batch matrix grows with
the square of the global batch (32k x 32k floats are 4 GiB); the sums are
the dense loss's, in another order.
"""

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import sharding


def pair_terms(image_embeddings, text_embeddings, scale, bias, positive):
  """[images, texts] -log sigmoid(z * logit): z = 1 where `positive`
  ([images, texts] bool), else -1."""
  logits = image_embeddings @ text_embeddings.T * scale + bias
  return -jax.nn.log_sigmoid(jnp.where(positive, logits, -logits))


def sigmoid_losses(image_embeddings, text_embeddings, scale, bias,
                   valid=None):
  """[N]: each image's sum of sigmoid terms over the (valid) texts, the
  whole batch's logits at once."""
  n = image_embeddings.shape[0]
  terms = pair_terms(image_embeddings, text_embeddings, scale, bias,
                     jnp.eye(n, dtype=bool))
  if valid is not None:
    terms = terms * valid[None, :]
  return terms.sum(axis=-1)


def sigmoid_loss(image_embeddings, text_embeddings, scale, bias):
  """big_vision's SigLIP loss: the mean over images of the sum over
  texts."""
  return sigmoid_losses(image_embeddings, text_embeddings, scale,
                        bias).mean()


def softmax_losses(image_embeddings, text_embeddings, scale, valid=None):
  """[N]: CLIP's loss of each pair, the mean of its image's cross-entropy
  over the texts and its text's over the images; rows not `valid` are
  left out of both softmaxes."""
  logits = image_embeddings @ text_embeddings.T * scale
  if valid is not None:
    valid = valid > 0
    logits = jnp.where(valid[None, :] & valid[:, None]
                       | jnp.eye(len(logits), dtype=bool), logits, -jnp.inf)
  diagonal = jnp.diagonal(logits)
  return (jax.nn.logsumexp(logits, axis=1) + jax.nn.logsumexp(logits, axis=0)
          ) / 2 - diagonal


def ring_size(mesh):
  """The devices the batch is split over on `mesh` (its data and fsdp
  axes): the steps of the chunked loss's ring."""
  return int(np.prod([mesh.shape[axis] for axis in sharding.BATCH_AXES]))


def chunked_sigmoid_losses(image_embeddings, text_embeddings, scale, bias,
                           valid):
  """`sigmoid_losses`, each device scoring its images against one block of
  texts at a time (module docstring), on the mesh the step is traced on
  (sharding.constrained); the dense loss where there is none, or one
  device in its ring."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or ring_size(mesh) == 1:
    return sigmoid_losses(image_embeddings, text_embeddings, scale, bias,
                          valid)
  size = ring_size(mesh)
  axes = sharding.BATCH_AXES
  # Device k of the ring sends what it holds to device k + 1.
  ring = [(k, (k + 1) % size) for k in range(size)]

  def per_device(images, texts, valid, scale, bias):
    n = images.shape[0]
    own = (pair_terms(images, texts, scale, bias, jnp.eye(n, dtype=bool))
           * valid[None, :]).sum(axis=-1)
    negatives = jnp.zeros((n, n), bool)

    # Recomputed in the backward pass: what a block keeps for it is its
    # texts, not its rows x rows logits, which would add up to the dense
    # loss's share of a device over the ring.
    @jax.checkpoint
    def negative_terms(images, texts, valid, scale, bias):
      return (pair_terms(images, texts, scale, bias, negatives)
              * valid[None, :]).sum(axis=-1)

    def next_block(_, carried):
      texts, valid, total = carried
      texts, valid = jax.lax.ppermute((texts, valid), axes, ring)
      return texts, valid, total + negative_terms(images, texts, valid,
                                                  scale, bias)

    return jax.lax.fori_loop(1, size, next_block, (texts, valid, own))[2]

  rows = sharding.activation_spec(("batch", None))
  examples = sharding.activation_spec(("batch",))
  replicated = jax.sharding.PartitionSpec()
  return jax.shard_map(
      per_device, in_specs=(rows, rows, examples, replicated, replicated),
      out_specs=examples)(image_embeddings, text_embeddings,
                          valid.astype(image_embeddings.dtype), scale, bias)
