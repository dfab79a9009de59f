"""The image-text losses (training/contrastive.py): the sigmoid loss is
big_vision's formula, CLIP's is CLIP's, and the sigmoid loss chunked over
the devices' ring equals the dense one, with its gradients, on the 8
emulated devices (across processes: tests/test_image_text.py's pod)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from vit_jax import sharding
from vit_jax.training import contrastive


def embeddings(n=16, d=8, seed=0):
  rng = np.random.default_rng(seed)
  images, texts = (rng.normal(size=(n, d)) for _ in range(2))
  return tuple((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(
      np.float32) for x in (images, texts))


def log_sigmoid(x):
  return -np.logaddexp(0, -x)


def big_vision_sigmoid_loss(zimg, ztxt, t, b):
  """big_vision's trainers/proj/image_text/siglip.py loss, in float64:
  logits t * zimg . ztxt + b; +1 labels on the diagonal, -1 elsewhere;
  the sum over each row's texts, then the mean over the images."""
  logits = np.float64(zimg) @ np.float64(ztxt).T * t + b
  labels = 2 * np.eye(len(logits)) - 1
  return np.mean(-np.sum(log_sigmoid(labels * logits), axis=-1))


@pytest.mark.parametrize("t, b", [(10.0, -10.0), (3.0, 0.5)])
def test_the_sigmoid_loss_is_big_visions(t, b):
  zimg, ztxt = embeddings()
  ours = contrastive.sigmoid_loss(zimg, ztxt, np.float32(t), np.float32(b))
  np.testing.assert_allclose(ours, big_vision_sigmoid_loss(zimg, ztxt, t, b),
                             rtol=1e-5)


def test_an_invalid_row_is_no_negative():
  """A broken record's row: its text is left out of every image's sum."""
  zimg, ztxt = embeddings()
  valid = np.ones(16, np.float32)
  valid[3] = 0
  kept = np.delete(np.arange(16), 3)
  ours = contrastive.sigmoid_losses(zimg, ztxt, 10.0, -10.0, valid)[kept]
  alone = contrastive.sigmoid_losses(zimg[kept], ztxt[kept], 10.0, -10.0)
  np.testing.assert_allclose(ours, alone, rtol=1e-6)


def test_the_softmax_loss_is_clips():
  """The mean of the images' and the texts' cross-entropies."""
  zimg, ztxt = embeddings()
  logits = np.float64(zimg) @ np.float64(ztxt).T * 20.0
  rows = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  columns = logits - np.log(np.exp(logits).sum(axis=0, keepdims=True))
  clip = -(np.diag(rows).mean() + np.diag(columns).mean()) / 2
  ours = contrastive.softmax_losses(zimg, ztxt, np.float32(20.0)).mean()
  np.testing.assert_allclose(ours, clip, rtol=1e-5)


@pytest.mark.parametrize("axes", [{"data": 8}, {"data": 2, "fsdp": 2,
                                                "model": 2}])
def test_the_chunked_loss_and_its_gradients_are_the_dense_ones(axes):
  """Each device's images against a block of texts at a time, the blocks
  passed round the ring of the batch's axes (8 or 4 devices): the loss
  and the gradients of both embeddings, the scale and the bias of the
  dense loss (1e-6), with a row left out."""
  mesh = sharding.make_mesh(axes)
  zimg, ztxt = embeddings(n=32)
  valid = np.ones(32, np.float32)
  valid[5] = 0
  weights = valid / valid.sum()

  def mean_loss(losses):
    return lambda zimg, ztxt, t, b: (weights * losses(
        zimg, ztxt, jnp.exp(t), b, valid)).sum()

  gradients = lambda losses: jax.value_and_grad(mean_loss(losses),
                                                argnums=(0, 1, 2, 3))
  args = (zimg, ztxt, jnp.float32(np.log(10)), jnp.float32(-10))
  dense = gradients(contrastive.sigmoid_losses)(*args)
  chunked = jax.jit(
      sharding.constrained(gradients(contrastive.chunked_sigmoid_losses),
                           mesh),
      in_shardings=(sharding.batch_sharding(mesh),) * 2
      + (NamedSharding(mesh, P()),) * 2)
  assert "collective-permute" in chunked.lower(*args).compile().as_text()
  loss, grads = chunked(*args)
  np.testing.assert_allclose(loss, dense[0], rtol=1e-6)
  for ours, expected in zip(grads, dense[1]):
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-7)
  assert np.abs(grads[1][5]).max() == 0  # the left-out text's


def test_no_device_holds_the_batch_by_batch_logits():
  """The chunked loss's largest buffer grows with the rows a device holds,
  not with the batch: XLA's temporaries for a batch of 8 x 512 rows stay
  below the dense loss's 4096 x 4096 logits."""
  mesh = sharding.make_mesh({"data": 8})
  n = 4096
  shapes = (jax.ShapeDtypeStruct((n, 16), jnp.float32),) * 2 + (
      jax.ShapeDtypeStruct((), jnp.float32),) * 2
  valid = jnp.ones(n)

  def memory(losses):
    step = jax.jit(sharding.constrained(
        jax.grad(lambda zi, zt, t, b: losses(zi, zt, t, b, valid).mean(),
                 argnums=(0, 1)), mesh),
        in_shardings=(sharding.batch_sharding(mesh),) * 2
        + (NamedSharding(mesh, P()),) * 2)
    return step.lower(*shapes).compile().memory_analysis().temp_size_in_bytes

  assert memory(contrastive.chunked_sigmoid_losses) < n * n * 4 / 8 / 4
  assert memory(contrastive.sigmoid_losses) >= n * n * 4 / 8
