"""The key names and array layouts of PyTorch ViTs, to and from ours.

The layouts: Hugging Face transformers' `ViTModel` /
`ViTForImageClassification` as the hub's files name them ("hf", which
transformers 4 and 5 both load and save; its DeiTs too, under "deit."), as
transformers 5.23's modules name them in a state_dict saved directly
("hf5"); timm's `VisionTransformer` ("timm", with its layer scale,
query/key norms, register token and attention pooling, and DeiT's
distillation token); and, read only, transformers' SigLIP and SigLIP 2
vision towers ("siglip", "siglip2"), DINOv2, with or without registers
("dinov2"; with DINOv2-g's SwiGLU MLP "dinov2_swiglu"), and DINOv3's ViTs
("dinov3"). Each stores a torch module as
`NAME.weight` and `NAME.bias`; the tables below map every module to its
place in the release layout (`Transformer/encoderblock_{i}/...`) and say
how its arrays convert, and the leaves (single parameters) to theirs. Everything here is
numpy and exact: transposes and reshapes, no arithmetic, so a file read and
written back is bitwise equal.

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
REGISTERS = "Transformer/registers"
# big_vision's attention-pooling head (classifier "map").
MAP = "MAPHead_0/"
MAP_ATTENTION = MAP + "MultiHeadDotProductAttention_0"
MAP_PROBE = MAP + "probe"
# The stacked projections of a fused Linear, in order.
FUSED = {"qkv": QKV, "kv": ("key", "value")}

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
# Outside the "vit." (or "deit.") prefix; a DeiT with its teacher's head
# names its class head `cls_classifier` (read as `classifier`).
HF_HEAD = {"classifier": ("head", "dense"),
           "distillation_classifier": ("head_dist", "dense")}
HF_LEAVES = {"embeddings.cls_token": "cls",
             "embeddings.distillation_token": "dist",  # DeiT's
             "embeddings.position_embeddings": POSEMB_KEY}

# timm fuses the query, key and value projections into one [3D, D] Linear.
TIMM_BLOCK = {
    "attn.qkv": (ATTENTION, "qkv"),
    "attn.q_norm": (ATTENTION + "/query_norm", "norm"),
    "attn.k_norm": (ATTENTION + "/key_norm", "norm"),
    "attn.proj": (ATTENTION + "/out", "heads_out"),
    "mlp.fc1": ("MlpBlock_3/Dense_0", "dense"),
    "mlp.fc1_g": ("MlpBlock_3/Dense_gate", "dense"),  # SwiGLU's gate
    "mlp.fc2": ("MlpBlock_3/Dense_1", "dense"),
    "norm1": ("LayerNorm_0", "norm"),
    "norm2": ("LayerNorm_2", "norm"),
}
TIMM_BLOCK_LEAVES = {"ls1.gamma": "ls1", "ls2.gamma": "ls2",
                     # an Eva's "mixed" RoPE frequencies, one block's
                     "attn.rope_freqs": ATTENTION + "/rope_freqs"}
# `norm` normalises every token; average-pool models normalise the pooled
# features instead (`fc_norm`, our final_norm "pooled"). `pre_logits.fc` is
# the tanh representation layer of timm before 0.6. `attn_pool` is
# global_pool="map": its latent is the probe, its `kv` the fused keys and
# values.
TIMM_TOP = {
    "patch_embed.proj": ("embedding", "conv"),
    "norm": ("Transformer/encoder_norm", "norm"),
    "fc_norm": ("fc_norm", "norm"),
    "pre_logits.fc": ("pre_logits", "dense"),
    "attn_pool.q": (MAP_ATTENTION + "/query", "heads_in"),
    "attn_pool.kv": (MAP_ATTENTION, "kv"),
    "attn_pool.proj": (MAP_ATTENTION + "/out", "heads_out"),
    "attn_pool.norm": (MAP + "LayerNorm_0", "norm"),
    "attn_pool.mlp.fc1": (MAP + "MlpBlock_0/Dense_0", "dense"),
    "attn_pool.mlp.fc2": (MAP + "MlpBlock_0/Dense_1", "dense"),
    "head": ("head", "dense"),
    "head_dist": ("head_dist", "dense"),  # DeiT's distillation head
}
TIMM_LEAVES = {"cls_token": "cls", "dist_token": "dist", "pos_embed": POSEMB_KEY,
               "reg_token": REGISTERS, "attn_pool.latent": MAP_PROBE}

# transformers' SigLIP vision tower: no class token, a position embedding
# kept as an nn.Embedding table [N, D], and torch's nn.MultiheadAttention
# for the pooling head (its fused `in_proj_weight` is read as the module
# `in_proj`).
SIGLIP_BLOCK = {
    "self_attn.q_proj": (ATTENTION + "/query", "heads_in"),
    "self_attn.k_proj": (ATTENTION + "/key", "heads_in"),
    "self_attn.v_proj": (ATTENTION + "/value", "heads_in"),
    "self_attn.out_proj": (ATTENTION + "/out", "heads_out"),
    "mlp.fc1": ("MlpBlock_3/Dense_0", "dense"),
    "mlp.fc2": ("MlpBlock_3/Dense_1", "dense"),
    "layer_norm1": ("LayerNorm_0", "norm"),
    "layer_norm2": ("LayerNorm_2", "norm"),
}
SIGLIP_TOP = {
    "embeddings.patch_embedding": ("embedding", "conv"),
    "post_layernorm": ("Transformer/encoder_norm", "norm"),
    "head.attention.in_proj": (MAP_ATTENTION, "qkv"),
    "head.attention.out_proj": (MAP_ATTENTION + "/out", "heads_out"),
    "head.layernorm": (MAP + "LayerNorm_0", "norm"),
    "head.mlp.fc1": (MAP + "MlpBlock_0/Dense_0", "dense"),
    "head.mlp.fc2": (MAP + "MlpBlock_0/Dense_1", "dense"),
}
SIGLIP_LEAVES = {"embeddings.position_embedding.weight": POSEMB_KEY,
                 "head.probe": MAP_PROBE}
# transformers' SigLIP text tower (SiglipTextModel, a SiglipModel's
# `text_model.`): its blocks are the vision tower's; the token embedding,
# the position table, the final norm and the head are the text tower's
# (models/text.py).
SIGLIP_TEXT_TOP = {"final_layer_norm": ("Transformer/encoder_norm", "norm"),
                   "head": ("head", "dense")}
SIGLIP_TEXT_LEAVES = {
    "embeddings.token_embedding.weight": "token_embedding/embedding",
    "embeddings.position_embedding.weight": POSEMB_KEY}
# SigLIP 2 (NaFlex) embeds patches with a Linear over each patch flattened
# as (row, column, channel): a convolution's kernel, reshaped.
SIGLIP2_TOP = {**SIGLIP_TOP,
               "embeddings.patch_embedding": ("embedding", "patches")}

# transformers' DINOv2: the hub's names; transformers 5.23's modules name
# the attention `attention.{q,k,v,o}_proj` (DINOV2_RENAMED).
DINOV2_BLOCK = {
    "attention.attention.query": (ATTENTION + "/query", "heads_in"),
    "attention.attention.key": (ATTENTION + "/key", "heads_in"),
    "attention.attention.value": (ATTENTION + "/value", "heads_in"),
    "attention.output.dense": (ATTENTION + "/out", "heads_out"),
    "mlp.fc1": ("MlpBlock_3/Dense_0", "dense"),
    "mlp.fc2": ("MlpBlock_3/Dense_1", "dense"),
    "norm1": ("LayerNorm_0", "norm"),
    "norm2": ("LayerNorm_2", "norm"),
}
# DINOv2-g's SwiGLU MLP (use_swiglu_ffn) as transformers 5 holds it;
# the hub's files fuse the gate and up projections into `mlp.weights_in`
# (swiglu_unfused and swiglu_fused below) and name the down one
# `mlp.weights_out`.
DINOV2_SWIGLU_BLOCK = {
    **{name: module for name, module in DINOV2_BLOCK.items()
       if not name.startswith("mlp.")},
    "mlp.gate_proj": ("MlpBlock_3/Dense_gate", "dense"),
    "mlp.up_proj": ("MlpBlock_3/Dense_0", "dense"),
    "mlp.down_proj": ("MlpBlock_3/Dense_1", "dense"),
}
DINOV2_RENAMED = {"attention.q_proj": "attention.attention.query",
                  "attention.k_proj": "attention.attention.key",
                  "attention.v_proj": "attention.attention.value",
                  "attention.o_proj": "attention.output.dense"}
DINOV2_BLOCK_LEAVES = {"layer_scale1.lambda1": "ls1",
                       "layer_scale2.lambda1": "ls2"}
DINOV2_TOP = {
    "embeddings.patch_embeddings.projection": ("embedding", "conv"),
    "layernorm": ("Transformer/encoder_norm", "norm"),
}
DINOV2_LEAVES = {"embeddings.cls_token": "cls",
                 "embeddings.position_embeddings": POSEMB_KEY,
                 "embeddings.register_tokens": REGISTERS}

# transformers' DINOv3 ViT: no position table (its rotary embedding has no
# params), the registers beside the class token in `embeddings`. The hub's
# files name the blocks `layer.{i}`, transformers 5.24's modules
# `model.layer.{i}`.
DINOV3_BLOCK = {
    "attention.q_proj": (ATTENTION + "/query", "heads_in"),
    "attention.k_proj": (ATTENTION + "/key", "heads_in"),
    "attention.v_proj": (ATTENTION + "/value", "heads_in"),
    "attention.o_proj": (ATTENTION + "/out", "heads_out"),
    "mlp.up_proj": ("MlpBlock_3/Dense_0", "dense"),
    "mlp.gate_proj": ("MlpBlock_3/Dense_gate", "dense"),  # use_gated_mlp
    "mlp.down_proj": ("MlpBlock_3/Dense_1", "dense"),
    "norm1": ("LayerNorm_0", "norm"),
    "norm2": ("LayerNorm_2", "norm"),
}
DINOV3_TOP = {
    "embeddings.patch_embeddings": ("embedding", "conv"),
    "norm": ("Transformer/encoder_norm", "norm"),
}
DINOV3_LEAVES = {"embeddings.cls_token": "cls",
                 "embeddings.register_tokens": REGISTERS}

# `table_leaves`: leaves torch keeps as a table [N, D] that we keep as
# [1, N, D]. `renamed`: key infixes of other transformers versions (or
# torch's parameter names), read as the layout's own.
LAYOUTS = {
    "hf": dict(blocks="encoder.layer.", block=HF_BLOCK, top=HF_TOP,
               leaves=HF_LEAVES),
    "hf5": dict(blocks="layers.", block=HF5_BLOCK, top=HF_TOP,
                leaves=HF_LEAVES),
    "timm": dict(blocks="blocks.", block=TIMM_BLOCK, top=TIMM_TOP,
                 leaves=TIMM_LEAVES, block_leaves=TIMM_BLOCK_LEAVES),
    "siglip": dict(blocks="encoder.layers.", block=SIGLIP_BLOCK,
                   top=SIGLIP_TOP, leaves=SIGLIP_LEAVES,
                   table_leaves=("embeddings.position_embedding.weight",),
                   renamed={"in_proj_weight": "in_proj.weight",
                            "in_proj_bias": "in_proj.bias"}),
    "dinov2": dict(blocks="encoder.layer.", block=DINOV2_BLOCK,
                   top=DINOV2_TOP, leaves=DINOV2_LEAVES,
                   block_leaves=DINOV2_BLOCK_LEAVES, renamed=DINOV2_RENAMED),
    "dinov2_swiglu": dict(blocks="encoder.layer.", block=DINOV2_SWIGLU_BLOCK,
                          top=DINOV2_TOP, leaves=DINOV2_LEAVES,
                          block_leaves=DINOV2_BLOCK_LEAVES,
                          renamed=DINOV2_RENAMED),
    "dinov3": dict(blocks="layer.", block=DINOV3_BLOCK,
                   top=DINOV3_TOP, leaves=DINOV3_LEAVES,
                   block_leaves=DINOV2_BLOCK_LEAVES,
                   renamed={"model.layer.": "layer."}),
}
LAYOUTS["siglip2"] = dict(LAYOUTS["siglip"], top=SIGLIP2_TOP)
LAYOUTS["siglip_text"] = dict(
    blocks="encoder.layers.", block=SIGLIP_BLOCK, top=SIGLIP_TEXT_TOP,
    leaves=SIGLIP_TEXT_LEAVES,
    table_leaves=("embeddings.position_embedding.weight",))


def _to_release(kind, weight, bias, num_heads):
  """{release leaf: array} of one torch module."""
  if kind == "norm":
    return {"scale": weight, "bias": bias}
  if kind == "dense":
    return {"kernel": weight.T, "bias": bias}
  if kind == "conv":
    return {"kernel": weight.transpose(2, 3, 1, 0), "bias": bias}
  if kind == "patches":
    side = int(round(np.sqrt(weight.shape[1] // 3)))
    if 3 * side * side != weight.shape[1]:
      raise errors.InputError(f"a patch embedding of {weight.shape[1]} "
                              "inputs is no square RGB patch")
    return {"kernel": weight.T.reshape(side, side, 3, -1), "bias": bias}
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
  names = FUSED[kind]
  out = {}
  for name, w, b in zip(names, np.split(weight, len(names)),
                        np.split(bias, len(names))):
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
  if kind == "patches":
    kernel = leaves["kernel"]
    return kernel.reshape(-1, kernel.shape[-1]).T, leaves["bias"]
  if kind == "heads_in":
    kernel = leaves["kernel"]
    # A projection without a bias (model.key_bias off) is written with a
    # zero one, which computes the same.
    bias = leaves.get("bias", np.zeros(kernel.shape[1:], kernel.dtype))
    return kernel.reshape(kernel.shape[0], -1).T, bias.reshape(-1)
  if kind == "heads_out":
    kernel = leaves["kernel"]
    return kernel.reshape(-1, kernel.shape[-1]).T, leaves["bias"]
  parts = [_from_release("heads_in", {
      leaf: leaves[f"{name}/{leaf}"] for leaf in ("kernel", "bias")
      if f"{name}/{leaf}" in leaves}) for name in FUSED[kind]]
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


def _leaves(layout, num_layers, prefix):
  """[(torch name, release leaf)] of every single parameter a layout can
  hold, blocks 0 .. num_layers - 1 included."""
  spec = LAYOUTS[layout]
  leaves = [(prefix + name, release) for name, release in
            spec["leaves"].items()]
  for i in range(num_layers):
    leaves += [(f"{prefix}{spec['blocks']}{i}.{name}", BLOCK.format(i) + release)
               for name, release in spec.get("block_leaves", {}).items()]
  return leaves


def to_release(tensors, layout, num_heads, prefix=""):
  """A flat {'a/b/c': array} release-layout dict of a torch state dict
  (`tensors`, numpy arrays) in `layout`, whose keys carry `prefix` (HF's
  "vit."; not its classifier). Keys the layout does not know are refused,
  naming them: they are parts vit_jax's VisionTransformer does not have."""
  spec = LAYOUTS[layout]
  tensors = dict(tensors)
  for old, new in spec.get("renamed", {}).items():
    tensors = {key.replace(old, new): value for key, value in tensors.items()}
  flat = {}
  num_layers = num_layers_of(tensors, layout, prefix)
  for name, release, kind in _modules(layout, num_layers, prefix):
    if name + ".weight" not in tensors:
      continue
    weight = tensors.pop(name + ".weight")
    bias = tensors.pop(name + ".bias", None)
    if bias is None:
      raise errors.InputError(f"{name}.weight has no {name}.bias")
    for leaf, value in _to_release(kind, weight, bias, num_heads).items():
      flat[f"{release}/{leaf}"] = value
  tables = {prefix + name for name in spec.get("table_leaves", ())}
  for name, release in _leaves(layout, num_layers, prefix):
    if name in tensors:
      value = tensors.pop(name)
      flat[release] = value[None] if name in tables else value
  if tensors:
    unknown = sorted(tensors)
    raise errors.InputError(
        f"not a {layout} ViT that vit_jax reads: it holds {len(unknown)} "
        f"tensors that vit_jax's VisionTransformer has no place for: "
        f"{unknown[:6]}{' ...' if len(unknown) > 6 else ''}")
  return flat


def from_release(flat, layout, prefix=""):
  """to_release's inverse: the torch state dict of a flat release-layout
  dict. Every key of `flat` must have a place in the layout."""
  spec = LAYOUTS[layout]
  flat = dict(flat)
  tensors = {}
  num_layers = len({key.split("/")[1] for key in flat
                    if key.startswith("Transformer/encoderblock_")})
  for name, release, kind in _modules(layout, num_layers, prefix):
    leaves = {key[len(release) + 1:]: flat.pop(key) for key in list(flat)
              if key.startswith(release + "/") and (
                  kind not in FUSED or
                  key[len(release) + 1:].split("/")[0] in FUSED[kind])}
    if leaves:
      weight, bias = _from_release(kind, leaves)
      tensors[name + ".weight"], tensors[name + ".bias"] = weight, bias
  tables = {prefix + name for name in spec.get("table_leaves", ())}
  for name, release in _leaves(layout, num_layers, prefix):
    if release in flat:
      value = flat.pop(release)
      tensors[name] = value[0] if name in tables else value
  if flat:
    raise errors.InputError(
        f"the {layout} layout has no place for {sorted(flat)[:6]}")
  return {name: np.ascontiguousarray(value) for name, value in tensors.items()}


# DINOv2's SwiGLU MLP in the hub's files: the gate and up projections
# fused into one Linear, the gate's rows first (as transformers 5 and
# dinov2's SwiGLUFFNFused split it); transformers 5 names them apart.
SWIGLU_FUSED = "mlp.weights_in."
SWIGLU_PARTS = ("mlp.gate_proj.", "mlp.up_proj.")
SWIGLU_OUT = ("mlp.weights_out.", "mlp.down_proj.")


def swiglu_unfused(tensors):
  """`tensors` (a DINOv2's with use_swiglu_ffn) in transformers 5's names:
  each fused `mlp.weights_in` split into its gate and up projections."""
  out = {}
  for name, value in tensors.items():
    if SWIGLU_FUSED in name:
      for part, half in zip(SWIGLU_PARTS, np.split(value, 2)):
        out[name.replace(SWIGLU_FUSED, part)] = half
    else:
      out[name.replace(*SWIGLU_OUT)] = value
  return out


def swiglu_fused(tensors):
  """swiglu_unfused's inverse: the hub's names, which transformers 4 and 5
  both load."""
  out = {name.replace(SWIGLU_OUT[1], SWIGLU_OUT[0]): value
         for name, value in tensors.items()
         if SWIGLU_PARTS[0] not in name and SWIGLU_PARTS[1] not in name}
  for name in tensors:
    if SWIGLU_PARTS[0] in name:
      out[name.replace(SWIGLU_PARTS[0], SWIGLU_FUSED)] = np.concatenate(
          [tensors[name], tensors[name.replace(*SWIGLU_PARTS)]])
  return out
