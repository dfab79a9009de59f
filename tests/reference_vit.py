"""An independent float64 NumPy forward pass of the released ViT.

Written from the paper and the release's file layout (docs/paper.md), sharing no
code with vit_jax.models; the hybrids' ResNet from BiT's description
(weight-standardised convolutions, GroupNorm, TensorFlow's "SAME" padding).
It reads the flat '/'-keyed arrays of a release .npz directly, so agreement
with our model checks both the model and the interchange.

`forward_torch` reads PyTorch state dicts in their own names and layouts
(HF transformers' ViT, timm's VisionTransformer), written from torch's
conventions (Linear: x W^T + b; Conv2d weight [out, in, kh, kw]), sharing
nothing with vit_jax.torch_layouts.
"""

import numpy as np
import scipy.special


def _layer_norm(x, p, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _gelu_exact(x):
  return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


GELU = {"tanh": _gelu_tanh, "exact": _gelu_exact}


def _sub(flat, prefix):
  return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def _attention(x, p, kv=None, eps=1e-6):
  """Multi-head attention of x's tokens to kv's (default: x's own), with
  each head's queries and keys layer-normalised where p holds their norms."""
  kv = x if kv is None else kv
  q, k, v = (np.einsum("nld,dhk->nlhk", x if n == "query" else kv,
                       p[f"{n}/kernel"]) + p[f"{n}/bias"]
             for n in ("query", "key", "value"))
  if "query_norm/scale" in p:
    q = _layer_norm(q, _sub(p, "query_norm/"), eps)
    k = _layer_norm(k, _sub(p, "key_norm/"), eps)
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


def _mlp(x, p, gelu):
  return GELU[gelu](x @ p["Dense_0/kernel"] + p["Dense_0/bias"]) @ (
      p["Dense_1/kernel"]) + p["Dense_1/bias"]


def forward(flat, images, classifier="token", eps=1e-6, gelu="tanh"):
  """Logits of the released ViT (or hybrid) for NHWC `images`, float64;
  `eps` and `gelu` as other sources of weights compute (the release: 1e-6,
  tanh). Today's parts, where the params hold them: per-block layer scales
  (`ls1`, `ls2`), register tokens after the class token with no position
  embedding (`Transformer/registers`), layer-normalised queries and keys
  per head, and with classifier "map" a probe's attention pooling and MLP
  (`MAPHead_0/`)."""
  ln = lambda x, p: _layer_norm(x, p, eps)
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
  # Registers: after the class token, with no position embedding.
  registers = flat.get("Transformer/registers")
  num_prefix = int(classifier == "token")
  if registers is not None:
    x = np.concatenate([x[:, :num_prefix],
                        np.broadcast_to(registers, (n,) + registers.shape[1:]),
                        x[:, num_prefix:]], axis=1)
    num_prefix += registers.shape[1]

  num_layers = len({k.split("/")[1] for k in flat
                    if k.startswith("Transformer/encoderblock_")})
  for i in range(num_layers):
    blk = _sub(flat, f"Transformer/encoderblock_{i}/")
    scale = lambda name: blk.get(name, 1.0)  # Layer scale, if any.
    y = ln(x, _sub(blk, "LayerNorm_0/"))
    x = x + scale("ls1") * _attention(
        y, _sub(blk, "MultiHeadDotProductAttention_1/"), eps=eps)
    y = ln(x, _sub(blk, "LayerNorm_2/"))
    x = x + scale("ls2") * _mlp(y, _sub(blk, "MlpBlock_3/"), gelu)
  if "fc_norm/scale" not in flat:
    x = ln(x, _sub(flat, "Transformer/encoder_norm/"))

  if classifier == "token":
    x = x[:, 0]
  elif classifier == "map":
    # A learned probe attends to every token; a residual MLP follows.
    head = _sub(flat, "MAPHead_0/")
    probe = np.broadcast_to(head["probe"], (n, 1, x.shape[-1]))
    y = _attention(probe, _sub(head, "MultiHeadDotProductAttention_0/"), kv=x,
                   eps=eps)
    y = y + _mlp(ln(y, _sub(head, "LayerNorm_0/")), _sub(head, "MlpBlock_0/"),
                 gelu)
    x = y[:, 0]
  else:
    x = x[:, num_prefix:].mean(axis=1)
  if "fc_norm/scale" in flat:
    x = ln(x, _sub(flat, "fc_norm/"))
  if "pre_logits/kernel" in flat:
    x = np.tanh(x @ flat["pre_logits/kernel"] + flat["pre_logits/bias"])
  return x @ flat["head/kernel"] + flat["head/bias"]


def _linear(t, name, x):
  return x @ t[name + ".weight"].T + t[name + ".bias"]


def _torch_norm(t, name, x, eps):
  return _layer_norm(x, {"scale": t[name + ".weight"],
                         "bias": t[name + ".bias"]}, eps)


def _heads_attention(q, k, v, num_heads):
  """[n, L, D] queries, keys, values -> [n, L, D], heads split from D."""
  n, length, width = q.shape
  split = lambda a: a.reshape(n, length, num_heads, width // num_heads)
  q, k, v = split(q), split(k), split(v)
  logits = np.einsum("nqhd,nkhd->nhqk", q, k) / np.sqrt(width // num_heads)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, length, width)


def forward_torch(tensors, images, layout, num_heads, eps, gelu):
  """Logits (or, with no head, the pooled features) of a PyTorch ViT state
  dict for NHWC `images`, float64. layout: "hf" (transformers' hub names,
  with or without the "vit." prefix of ViTForImageClassification) or
  "timm"."""
  t = {k[len("vit."):] if k.startswith("vit.") else k: np.asarray(v, np.float64)
       for k, v in tensors.items()}
  images = np.asarray(images, np.float64)
  act = GELU[gelu]
  embed = ("embeddings.patch_embeddings.projection" if layout == "hf"
           else "patch_embed.proj")
  weight = t[embed + ".weight"]
  width, _, p, _ = weight.shape
  n, h, w, c = images.shape
  patches = images.reshape(n, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
  x = np.einsum("nijabc,dcab->nijd", patches, weight) + t[embed + ".bias"]
  x = x.reshape(n, -1, width)
  cls = t.get("embeddings.cls_token" if layout == "hf" else "cls_token")
  posemb = t["embeddings.position_embeddings" if layout == "hf" else
             "pos_embed"]
  if cls is not None and posemb.shape[1] == x.shape[1]:  # no_embed_class
    x = x + posemb
  if cls is not None:
    x = np.concatenate([np.broadcast_to(cls, (n, 1, width)), x], axis=1)
  if posemb.shape[1] == x.shape[1]:
    x = x + posemb
  if layout == "hf":
    names = dict(block="encoder.layer.{}.", norm1="layernorm_before",
                 norm2="layernorm_after", fc1="intermediate.dense",
                 fc2="output.dense", proj="attention.output.dense",
                 norm="layernorm", head="classifier", pre_logits="pooler.dense")
  else:
    names = dict(block="blocks.{}.", norm1="norm1", norm2="norm2",
                 fc1="mlp.fc1", fc2="mlp.fc2", proj="attn.proj", norm="norm",
                 head="head", pre_logits="pre_logits.fc")
  num_layers = len({k.split(".")[2 if layout == "hf" else 1] for k in t
                    if k.startswith(names["block"].split("{")[0])})
  for i in range(num_layers):
    b = names["block"].format(i)
    y = _torch_norm(t, b + names["norm1"], x, eps)
    if layout == "hf":
      q, k, v = (_linear(t, f"{b}attention.attention.{m}", y)
                 for m in ("query", "key", "value"))
    else:
      q, k, v = np.split(_linear(t, b + "attn.qkv", y), 3, axis=-1)
    x = x + _linear(t, b + names["proj"], _heads_attention(q, k, v,
                                                            num_heads))
    y = _torch_norm(t, b + names["norm2"], x, eps)
    x = x + _linear(t, b + names["fc2"], act(_linear(t, b + names["fc1"], y)))
  if "fc_norm.weight" in t:
    x = _torch_norm(t, "fc_norm", x.mean(axis=1), eps)
  else:
    x = _torch_norm(t, names["norm"], x, eps)
    x = x[:, 0] if cls is not None else x.mean(axis=1)
  if names["pre_logits"] + ".weight" in t:
    x = np.tanh(_linear(t, names["pre_logits"], x))
  if names["head"] + ".weight" not in t:
    return x
  return _linear(t, names["head"], x)
