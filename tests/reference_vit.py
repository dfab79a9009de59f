"""An independent float64 NumPy forward pass of the released ViT.

Written from the paper and the release's file layout (docs/paper.md), sharing no
code with vit_jax.models; the hybrids' ResNet from BiT's description
(weight-standardised convolutions, GroupNorm, TensorFlow's "SAME" padding).
It reads the flat '/'-keyed arrays of a release .npz directly, so agreement
with our model checks both the model and the interchange.

`forward_torch` reads PyTorch state dicts in their own names and layouts
(HF transformers' ViT, timm's VisionTransformer), written from torch's
conventions (Linear: x W^T + b; Conv2d weight [out, in, kh, kw]), sharing
nothing with vit_jax.weights.pytorch.layouts.
`forward_siglip` (transformers' SigLIP
and SigLIP 2 image towers), `forward_dinov2` (DINOv2, with or without
registers), `forward_dinov3` (transformers' DINOv3 ViTs), `forward_eva_dinov3`
(timm's DINOv3 ports), `forward_eva_rope` (timm's RoPE ViTs) and `forward_timm` (timm's VisionTransformer with register
tokens, layer scale, query/key norms and attention pooling) read today's
checkpoints the same way; each matched the real libraries (transformers
5.23, timm 1.0.31, float64) to float64 rounding when it was written.
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


def _silu(x):
  return x / (1 + np.exp(-x))


def _sub(flat, prefix):
  return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def rope_phases(rows, cols, head_dim, theta):
  """[rows * cols, head_dim / 2] complex: DINOv3's 2-D rotary embedding of
  each patch of a rows x cols grid (row-major), as unit complex numbers.
  A patch's centre is placed in [-1, 1] along each axis; plane j < Dh/4
  turns by 2 pi y / theta^(4j / Dh) with y the row's place, plane
  Dh/4 + j by the same of the column's place x."""
  periods = theta ** (4 * np.arange(head_dim // 4) / head_dim)
  y = (2 * np.arange(rows) + 1) / rows - 1
  x = (2 * np.arange(cols) + 1) / cols - 1
  turns = [np.repeat(y, cols)[:, None] / periods,
           np.tile(x, rows)[:, None] / periods]
  return np.exp(2j * np.pi * np.concatenate(turns, axis=1))


def _turned(t, rope):
  """t [n, tokens, heads, Dh] with its patch tokens (after the first
  `num_prefix`) turned: channels j and j + Dh/2 taken as one complex
  number and multiplied by its phase."""
  num_prefix, phases = rope
  half = t.shape[-1] // 2
  patches = t[:, num_prefix:]
  z = (patches[..., :half] + 1j * patches[..., half:]) * phases[None, :, None]
  return np.concatenate([t[:, :num_prefix],
                         np.concatenate([z.real, z.imag], axis=-1)], axis=1)


def _attention(x, p, kv=None, eps=1e-6, rope=None):
  """Multi-head attention of x's tokens to kv's (default: x's own), with
  each head's queries and keys layer-normalised where p holds their norms,
  then the patches' turned by `rope` ((num_prefix, phases), or None)."""
  kv = x if kv is None else kv
  q, k, v = (np.einsum("nld,dhk->nlhk", x if n == "query" else kv,
                       p[f"{n}/kernel"]) + p[f"{n}/bias"]
             for n in ("query", "key", "value"))
  if "query_norm/scale" in p:
    q = _layer_norm(q, _sub(p, "query_norm/"), eps)
    k = _layer_norm(k, _sub(p, "key_norm/"), eps)
  if rope is not None:
    q, k = _turned(q, rope), _turned(k, rope)
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
  """Dense, GELU, Dense; or, with a gate (SwiGLU), SiLU of the gate's
  Dense times Dense_0's, then Dense_1."""
  hidden = x @ p["Dense_0/kernel"] + p["Dense_0/bias"]
  if "Dense_gate/kernel" in p:
    hidden = _silu(x @ p["Dense_gate/kernel"] + p["Dense_gate/bias"]) * hidden
  else:
    hidden = GELU[gelu](hidden)
  return hidden @ p["Dense_1/kernel"] + p["Dense_1/bias"]


def forward(flat, images, classifier="token", eps=1e-6, gelu="tanh",
            rope_theta=None):
  """Logits of the released ViT (or hybrid) for NHWC `images`, float64;
  `eps` and `gelu` as other sources of weights compute (the release: 1e-6,
  tanh). Today's parts, where the params hold them: per-block layer scales
  (`ls1`, `ls2`), register tokens after the class token with no position
  embedding (`Transformer/registers`), layer-normalised queries and keys
  per head, and with classifier "map" a probe's attention pooling and MLP
  (`MAPHead_0/`). With `rope_theta`, DINOv3's rotary embedding of the
  patches' queries and keys (`rope_phases`); with no position table in
  the params, none is added."""
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
  x = x + flat.get("Transformer/posembed_input/pos_embedding", 0.0)
  # Registers: after the class token, with no position embedding.
  registers = flat.get("Transformer/registers")
  num_prefix = int(classifier == "token")
  if registers is not None:
    x = np.concatenate([x[:, :num_prefix],
                        np.broadcast_to(registers, (n,) + registers.shape[1:]),
                        x[:, num_prefix:]], axis=1)
    num_prefix += registers.shape[1]
  rope = None
  if rope_theta is not None:
    rope = (num_prefix, rope_phases(h // p, w // p, _head_dim(flat),
                                    rope_theta))
  return _blocks_and_head(flat, x, num_prefix, classifier, eps, gelu,
                          rope=rope)


def _head_dim(flat):
  return flat["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/"
              "query/kernel"].shape[-1]


def _blocks_and_head(flat, x, num_prefix, classifier, eps, gelu,
                     features=False, rope=None):
  """The encoder blocks over embedded tokens x [n, tokens, D] (the first
  `num_prefix` the class token and registers; `rope` the blocks'
  attention's rotary embedding), the final norm, the pooling and the head:
  logits, or what the head reads (`features`)."""
  ln = lambda x, p: _layer_norm(x, p, eps)
  n = x.shape[0]
  num_layers = len({k.split("/")[1] for k in flat
                    if k.startswith("Transformer/encoderblock_")})
  for i in range(num_layers):
    blk = _sub(flat, f"Transformer/encoderblock_{i}/")
    scale = lambda name: blk.get(name, 1.0)  # Layer scale, if any.
    y = ln(x, _sub(blk, "LayerNorm_0/"))
    x = x + scale("ls1") * _attention(
        y, _sub(blk, "MultiHeadDotProductAttention_1/"), eps=eps, rope=rope)
    y = ln(x, _sub(blk, "LayerNorm_2/"))
    x = x + scale("ls2") * _mlp(y, _sub(blk, "MlpBlock_3/"), gelu)
  if "fc_norm/scale" not in flat:
    x = ln(x, _sub(flat, "Transformer/encoder_norm/"))

  if classifier == "token":
    x = x[:, 0]
  elif classifier == "map":
    # A learned probe attends to the patch tokens; a residual MLP follows.
    head = _sub(flat, "MAPHead_0/")
    probe = np.broadcast_to(head["probe"], (n, 1, x.shape[-1]))
    y = _attention(probe, _sub(head, "MultiHeadDotProductAttention_0/"),
                   kv=x[:, num_prefix:], eps=eps)
    y = y + _mlp(ln(y, _sub(head, "LayerNorm_0/")), _sub(head, "MlpBlock_0/"),
                 gelu)
    x = y[:, 0]
  else:
    x = x[:, num_prefix:].mean(axis=1)
  if "fc_norm/scale" in flat:
    x = ln(x, _sub(flat, "fc_norm/"))
  if "pre_logits/kernel" in flat:
    x = np.tanh(x @ flat["pre_logits/kernel"] + flat["pre_logits/bias"])
  if features:
    return x
  return x @ flat["head/kernel"] + flat["head/bias"]


def _resize_matrix(out_size, in_size):
  """[out_size, in_size]: torch's bilinear interpolate with antialias=True
  and align_corners=False along one axis, written from its algorithm: each
  output's centre in input pixels, a triangle filter stretched by the
  shrink factor when shrinking, its taps in a window around the centre,
  normalised to sum to 1."""
  scale = in_size / out_size
  support = max(scale, 1.0)
  matrix = np.zeros((out_size, in_size))
  for i in range(out_size):
    centre = scale * (i + 0.5)
    first = max(int(centre - support + 0.5), 0)
    last = min(int(centre + support + 0.5), in_size)
    for j in range(first, last):
      matrix[i, j] = max(0.0, 1.0 - abs((j - centre + 0.5) / support))
    matrix[i] /= matrix[i].sum()
  return matrix


def forward_naflex(flat, patches, grid, classifier="token", eps=1e-6,
                   gelu="tanh", features=False, rope_theta=None):
  """Logits (or `features`) of one image seen NaFlex-style, float64: its
  patches [rows * cols, p * p * 3] (row-major; each patch flattened as
  row, column, channel) in the model's input range, at grid (rows, cols),
  with no padding at all. The learned position table (square, or the
  "learn2d" row and column tables) is resized to the grid with
  `_resize_matrix` (none where the params hold no table); the rest is
  `forward`'s."""
  flat = {k: np.asarray(v, np.float64) for k, v in flat.items()}
  rows, cols = grid
  kernel = flat["embedding/kernel"]
  x = np.asarray(patches, np.float64)[:rows * cols] @ kernel.reshape(
      -1, kernel.shape[-1]) + flat["embedding/bias"]
  width = x.shape[-1]
  num_prefix = int(classifier == "token")
  if "Transformer/posembed_input/pos_embedding" in flat:
    table = flat["Transformer/posembed_input/pos_embedding"][0]
    prefix_posemb, table = table[:num_prefix], table[num_prefix:]
    side = int(round(np.sqrt(len(table))))
    table = table.reshape(side, side, width)
    posemb = np.einsum("ia,abd,jb->ijd", _resize_matrix(rows, side), table,
                       _resize_matrix(cols, side)).reshape(-1, width)
  elif "Transformer/posembed_input/row_embedding" in flat:  # "learn2d"
    row = flat["Transformer/posembed_input/row_embedding"]
    col = flat["Transformer/posembed_input/col_embedding"]
    row = _resize_matrix(rows, len(row)) @ row
    col = _resize_matrix(cols, len(col)) @ col
    posemb = np.concatenate([np.repeat(row, cols, axis=0),
                             np.tile(col, (rows, 1))], axis=1)
    prefix_posemb = flat.get("Transformer/posembed_input/token_embedding",
                             np.zeros((0, width)))
  else:
    posemb, prefix_posemb = 0.0, 0.0
  x = x + posemb
  if classifier == "token":
    x = np.concatenate([flat["cls"][0] + prefix_posemb, x])
  registers = flat.get("Transformer/registers")
  if registers is not None:
    x = np.concatenate([x[:num_prefix], registers[0], x[num_prefix:]])
    num_prefix += registers.shape[1]
  rope = None
  if rope_theta is not None:
    rope = (num_prefix, rope_phases(rows, cols, _head_dim(flat), rope_theta))
  return _blocks_and_head(flat, x[None], num_prefix, classifier, eps, gelu,
                          features, rope)[0]


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
  with or without the "vit." prefix of ViTForImageClassification; a DeiT's
  under "deit.") or "timm" (its VisionTransformer). A distillation token
  (timm's `dist_token`, transformers' `distillation_token`) follows the
  class token; where a head reads it (timm's `head_dist`, transformers'
  `distillation_classifier`), the logits are the mean of its head's and
  the class head's (`cls_classifier` in transformers), as DeiT gives them
  at inference."""
  t = {k.split(".", 1)[1] if k.startswith(("vit.", "deit.")) else k:
       np.asarray(v, np.float64) for k, v in tensors.items()}
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
  dist = t.get("embeddings.distillation_token" if layout == "hf"
              else "dist_token")
  prefix = [token for token in (cls, dist) if token is not None]
  x = np.concatenate([np.broadcast_to(token, (n, 1, width))
                      for token in prefix] + [x], axis=1)
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
  heads = (("cls_classifier", "distillation_classifier") if layout == "hf"
           else ("head", "head_dist"))
  if heads[1] + ".weight" in t:  # DeiT's: neither fc_norm nor pre-logits.
    x = _torch_norm(t, names["norm"], x, eps)
    return (_linear(t, heads[0], x[:, 0]) + _linear(t, heads[1], x[:, 1])) / 2
  if dist is not None and layout == "timm" and "head.weight" not in t:
    x = _torch_norm(t, names["norm"], x, eps)  # timm's headless DeiT
    return (x[:, 0] + x[:, 1]) / 2
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


# Today's PyTorch-world checkpoints, read in their own names: transformers'
# SigLIP and SigLIP 2 image towers, DINOv2 (with or without registers) and
# timm's VisionTransformer with its newer options. Written from torch's
# conventions (Linear: x W^T + b; Conv2d weight [out, in, kh, kw];
# nn.MultiheadAttention: in_proj_weight [3D, D] = q, k, v stacked) and each
# library's documented forward; sharing nothing with vit_jax.


def _strip(tensors, prefix):
  """float64 tensors, with `prefix` removed from the keys that have it
  (the others kept as they are)."""
  return {k[len(prefix):] if k.startswith(prefix) else k:
          np.asarray(v, np.float64) for k, v in tensors.items()}


def _conv_patches(t, name, images):
  """[n, N, D]: a Conv2d of stride = kernel over NHWC `images`, the patches
  in row-major order."""
  weight = t[name + ".weight"]
  width, _, p, _ = weight.shape
  n, h, w, c = images.shape
  patches = images.reshape(n, h // p, p, w // p, p, c).transpose(
      0, 1, 3, 2, 4, 5)
  x = np.einsum("nijabc,dcab->nijd", patches, weight) + t[name + ".bias"]
  return x.reshape(n, -1, width)


def _fused(weight, bias, parts):
  """The Linears (as functions) stacked in a fused one's rows: timm's qkv
  and kv, torch.nn.MultiheadAttention's in_proj."""
  return [lambda a, w=w, b=b: a @ w.T + b
          for w, b in zip(np.split(weight, parts), np.split(bias, parts))]


def _mha(t, q_in, kv_in, num_heads, q, k, v, out, norms=None, eps=1e-6):
  """Multi-head attention of q_in's tokens to kv_in's, given the names of
  the q, k, v and output Linears (or, for q/k/v, functions of the input);
  `norms` (names of the per-head query and key LayerNorms) where the
  model normalises them."""
  project = lambda f, x: f(x) if callable(f) else _linear(t, f, x)
  qs, ks, vs = project(q, q_in), project(k, kv_in), project(v, kv_in)
  n, width = q_in.shape[0], qs.shape[-1]
  head_dim = width // num_heads
  split = lambda a: a.reshape(n, a.shape[1], num_heads, head_dim)
  qs, ks, vs = split(qs), split(ks), split(vs)
  if norms:
    qs = _torch_norm(t, norms[0], qs, eps)
    ks = _torch_norm(t, norms[1], ks, eps)
  logits = np.einsum("nqhd,nkhd->nhqk", qs, ks) / np.sqrt(head_dim)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  y = np.einsum("nhqk,nkhd->nqhd", weights, vs).reshape(n, -1, width)
  return _linear(t, out, y)


def _torch_mlp(t, fc1, fc2, x, gelu):
  return _linear(t, fc2, GELU[gelu](_linear(t, fc1, x)))


def _apply_head(x, head):
  """Logits of pooled features under head = (kernel [D, C], bias), or the
  features themselves when head is None."""
  if head is None:
    return x
  kernel, bias = head
  return x @ np.asarray(kernel, np.float64) + np.asarray(bias, np.float64)


def forward_siglip(tensors, images, num_heads, eps=1e-6, gelu="tanh",
                   head=None):
  """The pooled features of transformers' SiglipVisionModel or
  Siglip2VisionModel (at its native square grid) for NHWC `images` in the
  model's input range, float64; logits under `head` = (kernel, bias).

  Keys with or without the hub's "vision_model." prefix; a two-tower file's
  text_model.*, logit_scale and logit_bias are ignored. SigLIP 2's
  patch_embedding is a Linear over patches flattened (row in patch, column
  in patch, channel), as its image processor flattens them. Pooling: the
  attention-pooling head's probe (MHA(probe, x, x), then y + mlp(ln(y)));
  with no head.* keys (vision_use_head=False), the mean of the tokens."""
  t = _strip(tensors, "vision_model.")
  t = {k: v for k, v in t.items()
       if not k.startswith("text_model.") and k not in ("logit_scale",
                                                         "logit_bias")}
  x = np.asarray(images, np.float64)
  n, h, w, c = x.shape
  weight = t["embeddings.patch_embedding.weight"]
  posemb = t["embeddings.position_embedding.weight"]
  if weight.ndim == 4:  # SigLIP: a Conv2d.
    x = _conv_patches(t, "embeddings.patch_embedding", x)
  else:  # SigLIP 2: a Linear over flattened patches.
    p = int(round(np.sqrt(weight.shape[1] // c)))
    side = int(round(np.sqrt(posemb.shape[0])))
    assert side * side == posemb.shape[0] and (h // p, w // p) == (side, side)
    patches = x.reshape(n, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = _linear(t, "embeddings.patch_embedding",
                patches.reshape(n, (h // p) * (w // p), p * p * c))
  x = x + posemb  # [N, D], in row-major order; no class token.
  num_layers = len({k.split(".")[2] for k in t
                    if k.startswith("encoder.layers.")})
  for i in range(num_layers):
    b = f"encoder.layers.{i}."
    y = _torch_norm(t, b + "layer_norm1", x, eps)
    x = x + _mha(t, y, y, num_heads, *(f"{b}self_attn.{m}_proj"
                                         for m in ("q", "k", "v", "out")))
    y = _torch_norm(t, b + "layer_norm2", x, eps)
    x = x + _torch_mlp(t, b + "mlp.fc1", b + "mlp.fc2", y, gelu)
  x = _torch_norm(t, "post_layernorm", x, eps)
  if "head.probe" not in t:
    return _apply_head(x.mean(axis=1), head)
  # torch.nn.MultiheadAttention: in_proj_weight holds q, k, v's rows.
  q, k, v = _fused(t["head.attention.in_proj_weight"],
                   t["head.attention.in_proj_bias"], 3)
  probe = np.broadcast_to(t["head.probe"], (n, 1, x.shape[-1]))
  y = _mha(t, probe, x, num_heads, q, k, v, "head.attention.out_proj")
  y = y + _torch_mlp(t, "head.mlp.fc1", "head.mlp.fc2",
                     _torch_norm(t, "head.layernorm", y, eps), gelu)
  return _apply_head(y[:, 0], head)


def forward_dinov2(tensors, images, num_heads, eps=1e-6, gelu="exact",
                   head=None):
  """The pooler output of transformers' Dinov2Model or
  Dinov2WithRegistersModel (layernorm(x)[:, 0]) for NHWC `images` at the
  checkpoint's resolution, float64; logits under `head` = (kernel, bias).
  The attention in the hub's names (attention.attention.{query,key,value},
  attention.output.dense) or transformers 5.23's (attention.{q,k,v,o}_proj)."""
  t = _strip(tensors, "dinov2.")
  x = _conv_patches(t, "embeddings.patch_embeddings.projection",
                    np.asarray(images, np.float64))
  n, _, width = x.shape
  x = np.concatenate([np.broadcast_to(t["embeddings.cls_token"],
                                      (n, 1, width)), x], axis=1)
  x = x + t["embeddings.position_embeddings"]
  registers = t.get("embeddings.register_tokens")
  if registers is not None:  # After the class token, no position embedding.
    x = np.concatenate([x[:, :1], np.broadcast_to(
        registers, (n,) + registers.shape[1:]), x[:, 1:]], axis=1)
  num_layers = len({k.split(".")[2] for k in t
                    if k.startswith("encoder.layer.")})
  for i in range(num_layers):
    b = f"encoder.layer.{i}."
    if b + "attention.q_proj.weight" in t:  # transformers 5.23's names
      names = [f"{b}attention.{m}_proj" for m in ("q", "k", "v", "o")]
    else:
      names = [f"{b}attention.attention.{m}" for m in ("query", "key",
                                                       "value")]
      names.append(b + "attention.output.dense")
    y = _torch_norm(t, b + "norm1", x, eps)
    x = x + t[b + "layer_scale1.lambda1"] * _mha(t, y, y, num_heads, *names)
    y = _torch_norm(t, b + "norm2", x, eps)
    x = x + t[b + "layer_scale2.lambda1"] * _torch_mlp(
        t, b + "mlp.fc1", b + "mlp.fc2", y, gelu)
  x = _torch_norm(t, "layernorm", x, eps)
  return _apply_head(x[:, 0], head)


def forward_dinov3(tensors, images, num_heads, eps=1e-5, gelu="exact",
                   head=None, rope_theta=100.0, pool="class"):
  """The pooler output of transformers' DINOv3ViTModel (norm(x)[:, 0];
  `pool` "patches": the mean of its last_hidden_state's patch tokens) for
  NHWC `images` of any size, float64 (logits under `head` = (kernel,
  bias)): the class token, the registers and
  the patches with no position table; in each block the patches' queries
  and keys turned by `rope_phases` of the image's grid; the projections
  without a bias in the file (its key's) computing none; the MLP gated
  where it has a gate_proj (down of SiLU(gate) * up)."""
  t = _strip(tensors, "model.")  # transformers' modules' names: the hub's.
  x = _conv_patches(t, "embeddings.patch_embeddings",
                    np.asarray(images, np.float64))
  n, _, width = x.shape
  p = t["embeddings.patch_embeddings.weight"].shape[-1]
  rows, cols = images.shape[1] // p, images.shape[2] // p
  prefix = [np.broadcast_to(t["embeddings.cls_token"], (n, 1, width))]
  if "embeddings.register_tokens" in t:
    registers = t["embeddings.register_tokens"]
    prefix.append(np.broadcast_to(registers, (n,) + registers.shape[1:]))
  x = np.concatenate(prefix + [x], axis=1)
  num_prefix = x.shape[1] - rows * cols
  rope = (num_prefix, rope_phases(rows, cols, width // num_heads,
                                  rope_theta))
  linear = lambda name, y: y @ t[name + ".weight"].T + t.get(
      name + ".bias", 0.0)
  heads = lambda y: y.reshape(n, -1, num_heads, width // num_heads)
  num_layers = len({k.split(".")[1] for k in t if k.startswith("layer.")})
  for i in range(num_layers):
    b = f"layer.{i}."
    y = _torch_norm(t, b + "norm1", x, eps)
    q, k, v = (heads(linear(f"{b}attention.{m}_proj", y)) for m in "qkv")
    q, k = _turned(q, rope), _turned(k, rope)
    logits = np.einsum("nqhd,nkhd->nhqk", q, k) / np.sqrt(q.shape[-1])
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = np.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, -1, width)
    x = x + t[b + "layer_scale1.lambda1"] * linear(b + "attention.o_proj", y)
    y = _torch_norm(t, b + "norm2", x, eps)
    if b + "mlp.gate_proj.weight" in t:  # use_gated_mlp: SiLU's SwiGLU.
      hidden = _silu(linear(b + "mlp.gate_proj", y)) * linear(
          b + "mlp.up_proj", y)
    else:
      hidden = GELU[gelu](linear(b + "mlp.up_proj", y))
    x = x + t[b + "layer_scale2.lambda1"] * linear(b + "mlp.down_proj",
                                                   hidden)
  x = _torch_norm(t, "norm", x, eps)
  pooled = x[:, 0] if pool == "class" else x[:, num_prefix:].mean(axis=1)
  return _apply_head(pooled, head)


def forward_eva_dinov3(tensors, images, num_heads, eps=1e-5, head=None,
                       rope_theta=100.0, pool="patches", attention=None):
  """The pooled features of timm's DINOv3 ports (its Eva class, global_pool
  "avg": the mean of the patch tokens after `norm`, the class token and
  registers left out) for NHWC `images` of any size, float64 (logits under
  `head` = (kernel, bias)). Its names: one fused qkv Linear whose biases are
  `q_bias` and `v_bias` (the key's none) or absent, layer scales `gamma_1`,
  `gamma_2`, the prefix tokens `cls_token` and `reg_token`, no position
  table, an MLP of fc1 and fc2 or a SwiGLU (fc2 of SiLU(fc1_g) * fc1_x);
  the patches' queries and keys turned by `rope_phases` as DINOv3 turns
  them (timm's rope_rotate_half). `pool` "class": its class token after
  `norm` (global_pool "token"). `attention`, a list where given: each
  layer's attention weights [n, heads, tokens, tokens] appended to it."""
  t = _strip(tensors, "")
  x = _conv_patches(t, "patch_embed.proj", np.asarray(images, np.float64))
  n, num_patches, width = x.shape
  p = t["patch_embed.proj.weight"].shape[-1]
  rows, cols = images.shape[1] // p, images.shape[2] // p
  prefix = [np.broadcast_to(t[name], (n,) + t[name].shape[1:])
            for name in ("cls_token", "reg_token")]
  x = np.concatenate(prefix + [x], axis=1)
  num_prefix = x.shape[1] - num_patches
  rope = (num_prefix, rope_phases(rows, cols, width // num_heads, rope_theta))
  heads = lambda y: y.reshape(n, -1, num_heads, width // num_heads)
  num_layers = len({k.split(".")[1] for k in t if k.startswith("blocks.")})
  for i in range(num_layers):
    b = f"blocks.{i}."
    y = _torch_norm(t, b + "norm1", x, eps)
    zero = np.zeros(width)
    bias = np.concatenate([t.get(b + "attn.q_bias", zero), zero,
                           t.get(b + "attn.v_bias", zero)])
    qkv = y @ t[b + "attn.qkv.weight"].T + bias
    q, k, v = (heads(part) for part in np.split(qkv, 3, axis=-1))
    q, k = _turned(q, rope), _turned(k, rope)
    logits = np.einsum("nqhd,nkhd->nhqk", q, k) / np.sqrt(q.shape[-1])
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    if attention is not None:
      attention.append(weights)
    y = np.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, -1, width)
    x = x + t[b + "gamma_1"] * _linear(t, b + "attn.proj", y)
    y = _torch_norm(t, b + "norm2", x, eps)
    if b + "mlp.fc1_g.weight" in t:  # timm's SwiGLU: SiLU of the gate.
      hidden = _silu(_linear(t, b + "mlp.fc1_g", y)) * _linear(
          t, b + "mlp.fc1_x", y)
      x = x + t[b + "gamma_2"] * _linear(t, b + "mlp.fc2", hidden)
    else:
      x = x + t[b + "gamma_2"] * _torch_mlp(t, b + "mlp.fc1", b + "mlp.fc2",
                                            y, "exact")
  x = _torch_norm(t, "norm", x, eps)
  pooled = x[:, 0] if pool == "class" else x[:, num_prefix:].mean(axis=1)
  return _apply_head(pooled, head)


def _interleaved_turned(t, angles):
  """t [n, tokens, heads, Dh] with its patch tokens (after the first) turned
  as timm's RoPE ViTs turn them: channels 2j and 2j + 1 as one complex
  number, multiplied by exp(i angles[..., j]); angles [patches, Dh / 2] or
  [patches, heads, Dh / 2]."""
  if angles.ndim == 2:
    angles = angles[:, None]
  patches = t[:, 1:]
  z = (patches[..., 0::2] + 1j * patches[..., 1::2]) * np.exp(1j * angles)
  turned = np.stack([z.real, z.imag], axis=-1).reshape(patches.shape)
  return np.concatenate([t[:, :1], turned], axis=1)


def forward_eva_rope(tensors, images, num_heads, eps=1e-6, theta=100.0,
                     features=False):
  """Logits (or, with no head, the pooled features) of timm's RoPE ViTs
  (its Eva class with attn_type "rope": `vit_*_rope_*`) for NHWC `images`,
  float64: a class token, which is pooled after `norm`; `pos_embed` over
  the class token and the patches, or the patches alone (no_embed_class),
  where the file has one (the images at its grid); one fused qkv Linear with its bias; layer scales `gamma_1`,
  `gamma_2`. The patches' queries and keys turn in interleaved channel
  pairs, by timm's "cat" angles (no `rope.freqs`): pair j < Dh / 4 by
  col / theta ** (4 j / Dh), pair Dh / 4 + j by row / theta ** (4 j / Dh),
  col and row the patch's indices; or, with `rope.freqs` [2, depth,
  heads, Dh / 2] ("mixed"), block l's pair j of head h by
  col * freqs[0, l, h, j] + row * freqs[1, l, h, j]. `features`: the
  pooled features, head or not."""
  t = _strip(tensors, "")
  x = _conv_patches(t, "patch_embed.proj", np.asarray(images, np.float64))
  n, num_patches, width = x.shape
  p = t["patch_embed.proj.weight"].shape[-1]
  rows, cols = images.shape[1] // p, images.shape[2] // p
  row, col = np.divmod(np.arange(rows * cols), cols)
  if "pos_embed" in t:  # The patches' alone (no_embed_class), or with the
    table = t["pos_embed"]  # class token's first.
    x = x + table[:, -num_patches:]
    cls = t["cls_token"] + (table[:, :1] if table.shape[1] > num_patches
                            else 0)
  else:
    cls = t["cls_token"]
  x = np.concatenate([np.broadcast_to(cls, (n, 1, width)), x], 1)
  head_dim = width // num_heads
  quarter = head_dim // 4
  bands = 1 / theta ** (np.arange(quarter) / quarter)
  cat = np.concatenate([col[:, None] * bands, row[:, None] * bands], axis=1)
  heads = lambda y: y.reshape(n, -1, num_heads, head_dim)
  num_layers = len({k.split(".")[1] for k in t if k.startswith("blocks.")})
  for i in range(num_layers):
    b = f"blocks.{i}."
    angles = cat
    if "rope.freqs" in t:
      freqs = t["rope.freqs"][:, i]  # [2, heads, Dh / 2]
      angles = (col[:, None, None] * freqs[0] + row[:, None, None] * freqs[1])
    y = _torch_norm(t, b + "norm1", x, eps)
    q, k, v = (heads(part) for part in np.split(
        _linear(t, b + "attn.qkv", y), 3, axis=-1))
    q, k = _interleaved_turned(q, angles), _interleaved_turned(k, angles)
    logits = np.einsum("nqhd,nkhd->nhqk", q, k) / np.sqrt(head_dim)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = np.einsum("nhqk,nkhd->nqhd", weights, v).reshape(n, -1, width)
    x = x + t[b + "gamma_1"] * _linear(t, b + "attn.proj", y)
    y = _torch_norm(t, b + "norm2", x, eps)
    x = x + t[b + "gamma_2"] * _torch_mlp(t, b + "mlp.fc1", b + "mlp.fc2", y,
                                          "exact")
  pooled = _torch_norm(t, "norm", x, eps)[:, 0]
  if "head.weight" in t and not features:
    return _linear(t, "head", pooled)
  return pooled


def forward_timm(tensors, images, num_heads, eps=1e-6, gelu="exact",
                 global_pool=None):
  """Logits (or, with no head.weight, the pooled features) of timm's
  VisionTransformer (1.0) for NHWC `images`, float64, with today's options
  read from the keys: cls_token and reg_token (the prefix tokens, class
  token first); pos_embed over prefix and patches, or (no_embed_class)
  over the patches only, the prefix then getting none; per-head q_norm /
  k_norm; layer scales ls1.gamma / ls2.gamma; and the pooling:
  global_pool "map" (attn_pool.*, over the patch tokens only: timm's
  pool_include_prefix=False), "avg" (the mean of the patch tokens, prefix
  excluded, then fc_norm where present) or "token" (norm(x)[:, 0]).
  `global_pool` None reads it from the keys: map with attn_pool, avg with
  fc_norm or no class token, else token."""
  t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
  x = _conv_patches(t, "patch_embed.proj", np.asarray(images, np.float64))
  n, num_patches, width = x.shape
  prefix = [np.broadcast_to(t[name], (n,) + t[name].shape[1:])
            for name in ("cls_token", "reg_token") if name in t]
  num_prefix = sum(a.shape[1] for a in prefix)
  posemb = t["pos_embed"]
  if posemb.shape[1] == num_patches:  # no_embed_class: add, then concatenate
    x = np.concatenate(prefix + [x + posemb], axis=1)
  else:
    x = np.concatenate(prefix + [x], axis=1) + posemb
  num_layers = len({k.split(".")[1] for k in t if k.startswith("blocks.")})
  for i in range(num_layers):
    b = f"blocks.{i}."
    ls1, ls2 = (t.get(f"{b}{name}.gamma", 1.0) for name in ("ls1", "ls2"))
    y = _torch_norm(t, b + "norm1", x, eps)
    q, k, v = _fused(t[b + "attn.qkv.weight"], t[b + "attn.qkv.bias"], 3)
    norms = ((b + "attn.q_norm", b + "attn.k_norm")
             if b + "attn.q_norm.weight" in t else None)
    x = x + ls1 * _mha(t, y, y, num_heads, q, k, v, b + "attn.proj", norms,
                       eps)
    y = _torch_norm(t, b + "norm2", x, eps)
    x = x + ls2 * _torch_mlp(t, b + "mlp.fc1", b + "mlp.fc2", y, gelu)
  if "norm.weight" in t:
    x = _torch_norm(t, "norm", x, eps)
  if global_pool is None:
    global_pool = ("map" if "attn_pool.latent" in t else
                   "avg" if "fc_norm.weight" in t or "cls_token" not in t else
                   "token")
  if global_pool == "map":
    k, v = _fused(t["attn_pool.kv.weight"], t["attn_pool.kv.bias"], 2)
    latent = np.broadcast_to(t["attn_pool.latent"], (n, 1, width))
    y = _mha(t, latent, x[:, num_prefix:], num_heads, "attn_pool.q", k, v,
             "attn_pool.proj")
    y = y + _torch_mlp(t, "attn_pool.mlp.fc1", "attn_pool.mlp.fc2",
                       _torch_norm(t, "attn_pool.norm", y, eps), gelu)
    x = y[:, 0]
  elif global_pool == "avg":
    x = x[:, num_prefix:].mean(axis=1)
  else:
    x = x[:, 0]
  if "fc_norm.weight" in t:
    x = _torch_norm(t, "fc_norm", x, eps)
  if "head.weight" not in t:
    return x
  return _linear(t, "head", x)
