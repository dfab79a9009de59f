"""The key names and array layouts of PyTorch ViTs, to and from ours.

Three layouts: Hugging Face transformers' `ViTModel` /
`ViTForImageClassification` as the hub's files name them ("hf", which
transformers 4 and 5 both load), as transformers 5.23 saves them ("hf5")
and timm's `VisionTransformer` ("timm"). Both store each torch module
as `NAME.weight` and `NAME.bias`; the tables below map every module to its
place in the release layout (`Transformer/encoderblock_{i}/...`) and say how
its arrays convert. Everything here is numpy and exact: transposes and
reshapes, no arithmetic, so a file read and written back is bitwise equal.

Array conventions: torch's Linear keeps weight [out, in] (ours: kernel [in,
out]); its Conv2d weight [out, in, kh, kw] (ours: [kh, kw, in, out]); its
LayerNorm weight is our scale. Our attention kernels split the heads out:
query/key/value [D, heads, D/heads], out [heads, D/heads, D].
"""

import re

import numpy as np

from vit_jax import errors
from vit_jax.models import POSEMB_KEY

BLOCK = "Transformer/encoderblock_{}/"
QKV = ("query", "key", "value")
ATTENTION = "MultiHeadDotProductAttention_1"

# torch module (after the layout's block prefix) -> (release module, kind).
HF_BLOCK = {
    "attention.attention.query": (ATTENTION + "/query", "heads_in"),
    "attention.attention.key": (ATTENTION + "/key", "heads_in"),
    "attention.attention.value": (ATTENTION + "/value", "heads_in"),
    "attention.output.dense": (ATTENTION + "/out", "heads_out"),
    "intermediate.dense": ("MlpBlock_3/Dense_0", "dense"),
    "output.dense": ("MlpBlock_3/Dense_1", "dense"),
    "layernorm_before": ("LayerNorm_0", "norm"),
    "layernorm_after": ("LayerNorm_2", "norm"),
}
HF5_BLOCK = {
    "attention.q_proj": (ATTENTION + "/query", "heads_in"),
    "attention.k_proj": (ATTENTION + "/key", "heads_in"),
    "attention.v_proj": (ATTENTION + "/value", "heads_in"),
    "attention.o_proj": (ATTENTION + "/out", "heads_out"),
    "mlp.fc1": ("MlpBlock_3/Dense_0", "dense"),
    "mlp.fc2": ("MlpBlock_3/Dense_1", "dense"),
    "layernorm_before": ("LayerNorm_0", "norm"),
    "layernorm_after": ("LayerNorm_2", "norm"),
}
# ViTModel's pooler (a tanh Dense on the class token) is the release's
# pre-logits layer; ViTForImageClassification has no pooler, and its head.
HF_TOP = {
    "embeddings.patch_embeddings.projection": ("embedding", "conv"),
    "layernorm": ("Transformer/encoder_norm", "norm"),
    "pooler.dense": ("pre_logits", "dense"),
}
HF_HEAD = {"classifier": ("head", "dense")}  # Outside the "vit." prefix.
HF_LEAVES = {"embeddings.cls_token": "cls",
             "embeddings.position_embeddings": POSEMB_KEY}

# timm fuses the query, key and value projections into one [3D, D] Linear.
TIMM_BLOCK = {
    "attn.qkv": (ATTENTION, "qkv"),
    "attn.proj": (ATTENTION + "/out", "heads_out"),
    "mlp.fc1": ("MlpBlock_3/Dense_0", "dense"),
    "mlp.fc2": ("MlpBlock_3/Dense_1", "dense"),
    "norm1": ("LayerNorm_0", "norm"),
    "norm2": ("LayerNorm_2", "norm"),
}
# `norm` normalises every token; average-pool models normalise the pooled
# features instead (`fc_norm`, our final_norm "pooled"). `pre_logits.fc` is
# the tanh representation layer of timm before 0.6.
TIMM_TOP = {
    "patch_embed.proj": ("embedding", "conv"),
    "norm": ("Transformer/encoder_norm", "norm"),
    "fc_norm": ("fc_norm", "norm"),
    "pre_logits.fc": ("pre_logits", "dense"),
    "head": ("head", "dense"),
}
TIMM_LEAVES = {"cls_token": "cls", "pos_embed": POSEMB_KEY}

LAYOUTS = {
    "hf": dict(blocks="encoder.layer.", block=HF_BLOCK, top=HF_TOP,
               leaves=HF_LEAVES),
    "hf5": dict(blocks="layers.", block=HF5_BLOCK, top=HF_TOP,
                leaves=HF_LEAVES),
    "timm": dict(blocks="blocks.", block=TIMM_BLOCK, top=TIMM_TOP,
                 leaves=TIMM_LEAVES),
}


def _to_release(kind, weight, bias, num_heads):
  """{release leaf: array} of one torch module."""
  if kind == "norm":
    return {"scale": weight, "bias": bias}
  if kind == "dense":
    return {"kernel": weight.T, "bias": bias}
  if kind == "conv":
    return {"kernel": weight.transpose(2, 3, 1, 0), "bias": bias}
  width = weight.shape[1] if kind != "heads_out" else weight.shape[0]
  if width % num_heads:
    raise errors.InputError(f"{num_heads} heads do not divide the width "
                            f"{width}")
  head_dim = width // num_heads
  if kind == "heads_in":
    return {"kernel": weight.T.reshape(-1, num_heads, head_dim),
            "bias": bias.reshape(num_heads, head_dim)}
  if kind == "heads_out":
    return {"kernel": weight.T.reshape(num_heads, head_dim, -1), "bias": bias}
  assert kind == "qkv", kind
  out = {}
  for name, w, b in zip(QKV, np.split(weight, 3), np.split(bias, 3)):
    for leaf, value in _to_release("heads_in", w, b, num_heads).items():
      out[f"{name}/{leaf}"] = value
  return out


def _from_release(kind, leaves):
  """(weight, bias) of one torch module from its release `leaves`."""
  if kind == "norm":
    return leaves["scale"], leaves["bias"]
  if kind == "dense":
    return leaves["kernel"].T, leaves["bias"]
  if kind == "conv":
    return leaves["kernel"].transpose(3, 2, 0, 1), leaves["bias"]
  if kind == "heads_in":
    kernel = leaves["kernel"]
    return kernel.reshape(kernel.shape[0], -1).T, leaves["bias"].reshape(-1)
  if kind == "heads_out":
    kernel = leaves["kernel"]
    return kernel.reshape(-1, kernel.shape[-1]).T, leaves["bias"]
  assert kind == "qkv", kind
  parts = [_from_release("heads_in", {
      "kernel": leaves[f"{name}/kernel"], "bias": leaves[f"{name}/bias"]})
           for name in QKV]
  return (np.concatenate([w for w, _ in parts]),
          np.concatenate([b for _, b in parts]))


def _modules(layout, num_layers, prefix):
  """[(torch module, release module, kind)] of every module a layout can
  hold, blocks 0 .. num_layers - 1 included."""
  spec = LAYOUTS[layout]
  modules = [(prefix + name, release, kind)
             for name, (release, kind) in spec["top"].items()]
  if layout.startswith("hf"):
    modules += [(name, release, kind)
                for name, (release, kind) in HF_HEAD.items()]
  for i in range(num_layers):
    modules += [(f"{prefix}{spec['blocks']}{i}.{name}", BLOCK.format(i) + release,
                 kind) for name, (release, kind) in spec["block"].items()]
  return modules


def qkv_weights(layout, num_layers, prefix=""):
  """The names of the query, key and value weights of every block."""
  return [name + ".weight" for name, release, _ in
          _modules(layout, num_layers, prefix)
          if release.endswith(tuple("/" + n for n in QKV))]


def num_layers_of(keys, layout, prefix=""):
  blocks = re.escape(prefix + LAYOUTS[layout]["blocks"])
  return len({m.group(1) for key in keys
              if (m := re.match(blocks + r"(\d+)\.", key))})


def to_release(tensors, layout, num_heads, prefix=""):
  """A flat {'a/b/c': array} release-layout dict of a torch state dict
  (`tensors`, numpy arrays) in `layout`, whose keys carry `prefix` (HF's
  "vit."; not its classifier). Keys the layout does not know are refused,
  naming them: they are parts a ViT of the paper does not have."""
  tensors = dict(tensors)
  flat = {}
  for name, release, kind in _modules(layout, num_layers_of(tensors, layout,
                                                            prefix), prefix):
    if name + ".weight" not in tensors:
      continue
    weight = tensors.pop(name + ".weight")
    bias = tensors.pop(name + ".bias", None)
    if bias is None:
      raise errors.InputError(f"{name}.weight has no {name}.bias")
    for leaf, value in _to_release(kind, weight, bias, num_heads).items():
      flat[f"{release}/{leaf}"] = value
  for name, release in LAYOUTS[layout]["leaves"].items():
    if prefix + name in tensors:
      flat[release] = tensors.pop(prefix + name)
  if tensors:
    unknown = sorted(tensors)
    raise errors.InputError(
        f"not a plain {layout} ViT: it holds {len(unknown)} tensors that "
        f"vit_jax's VisionTransformer has no place for: {unknown[:6]}"
        f"{' ...' if len(unknown) > 6 else ''}")
  return flat


def from_release(flat, layout, prefix=""):
  """to_release's inverse: the torch state dict of a flat release-layout
  dict. Every key of `flat` must have a place in the layout."""
  flat = dict(flat)
  tensors = {}
  num_layers = len({key.split("/")[1] for key in flat
                    if key.startswith("Transformer/encoderblock_")})
  for name, release, kind in _modules(layout, num_layers, prefix):
    leaves = {key[len(release) + 1:]: flat.pop(key) for key in list(flat)
              if key.startswith(release + "/") and (
                  kind != "qkv" or key.split("/")[3] in QKV)}
    if leaves:
      weight, bias = _from_release(kind, leaves)
      tensors[name + ".weight"], tensors[name + ".bias"] = weight, bias
  for name, release in LAYOUTS[layout]["leaves"].items():
    if release in flat:
      tensors[prefix + name] = flat.pop(release)
  if flat:
    raise errors.InputError(
        f"the {layout} layout has no place for {sorted(flat)[:6]}")
  return {name: np.ascontiguousarray(value) for name, value in tensors.items()}
