"""An independent float64 NumPy forward pass of the released ViT.

Written from the paper and the release's file layout (docs/paper.md), sharing no
code with vit_jax.models; the hybrids' ResNet from BiT's description
(weight-standardised convolutions, GroupNorm, TensorFlow's "SAME" padding).
It reads the flat '/'-keyed arrays of a release .npz directly, so agreement
with our model checks both the model and the interchange.
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


def _same_padding(size, kernel, stride):
  """(before, after) of TensorFlow's "SAME": the output is ceil(size /
  stride), the extra row or column going after."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def _windows(x, kernel, stride, fill):
  """[n, out, out, kernel, kernel, c]: every window of a "SAME" pass."""
  pad = _same_padding(x.shape[1], kernel, stride)
  x = np.pad(x, ((0, 0), pad, pad, (0, 0)), constant_values=fill)
  out = -(-(x.shape[1] - sum(pad)) // stride)
  rows = np.arange(out)[:, None] * stride + np.arange(kernel)[None]
  return x[:, rows][:, :, :, rows].transpose(0, 1, 3, 2, 4, 5)


def _std_conv(x, kernel, stride):
  """A convolution whose kernel [k, k, in, out] is first standardised per
  output channel (BiT's weight standardisation)."""
  mean = kernel.mean(axis=(0, 1, 2))
  std = np.sqrt(((kernel - mean) ** 2).mean(axis=(0, 1, 2)))
  kernel = (kernel - mean) / (std + 1e-5)
  return np.tensordot(_windows(x, kernel.shape[0], stride, 0.0), kernel,
                      axes=([3, 4, 5], [0, 1, 2]))


def _group_norm(x, p, groups=32):
  n, h, w, c = x.shape
  g = x.reshape(n, h, w, groups, c // groups)
  mean = g.mean(axis=(1, 2, 4), keepdims=True)
  var = ((g - mean) ** 2).mean(axis=(1, 2, 4), keepdims=True)
  g = (g - mean) / np.sqrt(var + 1e-6)
  return g.reshape(n, h, w, c) * p["scale"] + p["bias"]


def _relu(x):
  return np.maximum(x, 0)


def _bit_stem(flat, x):
  """The hybrids' BiT ResNet: root, then bottleneck units block{i}/unit{j}."""
  x = _relu(_group_norm(_std_conv(x, flat["conv_root/kernel"], 2),
                        _sub(flat, "gn_root/")))
  x = _windows(x, 3, 2, -np.inf).max(axis=(3, 4))
  num_blocks = len({k.split("/")[0] for k in flat if k.startswith("block")})
  for i in range(1, num_blocks + 1):
    num_units = len({k.split("/")[1] for k in flat
                     if k.startswith(f"block{i}/")})
    for j in range(1, num_units + 1):
      unit = _sub(flat, f"block{i}/unit{j}/")
      stride = 2 if i > 1 and j == 1 else 1
      residual = x
      if "conv_proj/kernel" in unit:
        residual = _group_norm(_std_conv(x, unit["conv_proj/kernel"], stride),
                               _sub(unit, "gn_proj/"))
      y = _relu(_group_norm(_std_conv(x, unit["conv1/kernel"], 1),
                            _sub(unit, "gn1/")))
      y = _relu(_group_norm(_std_conv(y, unit["conv2/kernel"], stride),
                            _sub(unit, "gn2/")))
      y = _group_norm(_std_conv(y, unit["conv3/kernel"], 1), _sub(unit, "gn3/"))
      x = _relu(residual + y)
  return x


def forward(flat, images, classifier="token"):
  """Logits of the released ViT (or hybrid) for NHWC `images`, float64."""
  flat = {k: np.asarray(v, np.float64) for k, v in flat.items()}
  images = np.asarray(images, np.float64)
  if "conv_root/kernel" in flat:
    images = _bit_stem(flat, images)
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
