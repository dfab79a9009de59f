"""An independent float64 NumPy forward pass of the released ViT.

Written from the paper and the release's file layout (PAPER.md), sharing no
code with vit_jax.models: it reads the flat '/'-keyed arrays of a release
.npz directly, so agreement with our model checks both the model and the
interchange.
"""

import numpy as np


def _layer_norm(x, p):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * p["scale"] + p["bias"]


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _sub(flat, prefix):
  return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def _attention(x, p):
  q, k, v = (np.einsum("nld,dhk->nlhk", x, p[f"{n}/kernel"]) + p[f"{n}/bias"]
             for n in ("query", "key", "value"))
  logits = np.einsum("nqhd,nkhd->nhqk", q, k) / np.sqrt(q.shape[-1])
  logits -= logits.max(-1, keepdims=True)
  weights = np.exp(logits)
  weights /= weights.sum(-1, keepdims=True)
  out = np.einsum("nhqk,nkhd->nqhd", weights, v)
  return np.einsum("nqhd,hdo->nqo", out, p["out/kernel"]) + p["out/bias"]


def forward(flat, images, classifier="token"):
  """Logits of the released ViT for NHWC `images`, float64."""
  flat = {k: np.asarray(v, np.float64) for k, v in flat.items()}
  images = np.asarray(images, np.float64)
  kernel = flat["embedding/kernel"]
  p = kernel.shape[0]
  n, h, w, c = images.shape
  patches = images.reshape(n, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  x = np.einsum("nijabc,abcd->nijd", patches, kernel) + flat["embedding/bias"]
  x = x.reshape(n, -1, kernel.shape[-1])
  if classifier == "token":
    cls = np.broadcast_to(flat["cls"], (n, 1, x.shape[-1]))
    x = np.concatenate([cls, x], axis=1)
  x = x + flat["Transformer/posembed_input/pos_embedding"]

  num_layers = len({k.split("/")[1] for k in flat
                    if k.startswith("Transformer/encoderblock_")})
  for i in range(num_layers):
    blk = _sub(flat, f"Transformer/encoderblock_{i}/")
    y = _layer_norm(x, _sub(blk, "LayerNorm_0/"))
    x = x + _attention(y, _sub(blk, "MultiHeadDotProductAttention_1/"))
    y = _layer_norm(x, _sub(blk, "LayerNorm_2/"))
    mlp = _sub(blk, "MlpBlock_3/")
    y = _gelu_tanh(y @ mlp["Dense_0/kernel"] + mlp["Dense_0/bias"])
    x = x + y @ mlp["Dense_1/kernel"] + mlp["Dense_1/bias"]
  x = _layer_norm(x, _sub(flat, "Transformer/encoder_norm/"))

  x = x[:, 0] if classifier == "token" else x.mean(axis=1)
  if "pre_logits/kernel" in flat:
    x = np.tanh(x @ flat["pre_logits/kernel"] + flat["pre_logits/bias"])
  return x @ flat["head/kernel"] + flat["head/bias"]
