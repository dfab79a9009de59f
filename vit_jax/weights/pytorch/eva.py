"""timm's Eva class (timm.models.eva): its DINOv3 ports and its RoPE ViTs,
read through timm.py once in timm VisionTransformer's names, and written.
"""

import re

import numpy as np

from vit_jax import errors, models
from vit_jax.weights.pytorch import files, layouts

# timm's Eva class (timm.models.eva) holds two families that vit_jax reads,
# told apart by their tensors (`eva_kind`):
# - "dinov3", its DINOv3 ports (`vit_*_patch16_dinov3*`): no position table
#   but DINOv3's axial rotary embedding at period 100, four registers
#   beside the class token, LayerNorm at epsilon 1e-5, the query and value
#   biases (`q_bias`, `v_bias`; the key's is a zero buffer) or none, and a
#   SwiGLU MLP in the largest (`fc1_g`, `fc1_x`, `fc2`);
# - its RoPE ViTs (`vit_*_patch16_rope_224`, `..._rope_ape_224` with a
#   position table): "index", timm's "cat" rotary embedding over the
#   patches' indices at period 100, and "mixed" (`..._rope_mixed_*`), its
#   learned frequencies (`rope.freqs`, [2, depth, heads, Dh / 2]); a class
#   token, which they pool, no registers, one fused qkv with its bias.
# All have layer scales `gamma_1`/`gamma_2` and heads 64 wide, but the
# DINOv3 7B's (32 heads of 128). The RoPE ViTs rotate interleaved channel
# pairs (2j, 2j + 1), "index" the column's planes before the row's;
# vit_jax pairs channel j with j + Dh / 2, the row's first, so their
# query and key channels are permuted within each head (`_rope_channels`),
# which leaves every q.k as it was. EVA-02 (timm's "cat" RoPE with a
# SwiGLU MLP, at its own period) is refused.
EVA_MARKS = ("blocks.0.gamma_1", "blocks.0.attn.q_bias", "rope.freqs",
             "blocks.0.mlp.fc1_g.weight")
EVA_FUNCTIONS = {
    "dinov3": {"rope": "axial", "rope_theta": 100.0,
               "layer_norm_epsilon": 1e-5},
    "index": {"rope": "index", "rope_theta": 100.0},
    "mixed": {"rope": "mixed", "rope_theta": 10.0},  # its initial periods
}
EVA_HEAD_DIM = 64
EVA_HEADS = {4096: 32}  # by width, where the heads are not 64 wide
# timm's input size of its DINOv3 ports (their pretrained_cfg); its RoPE
# ViTs' is 224.
EVA_IMAGE_SIZES = {"dinov3": 256, "index": 224, "mixed": 224}


def eva_kind(names, path):
  """None for a timm VisionTransformer, else the kind of timm Eva the tensor
  `names` are (EVA_FUNCTIONS' keys); InputError for an Eva that vit_jax
  does not compute, naming why."""
  if not any(mark in names for mark in EVA_MARKS):
    return None
  if "rope.freqs" in names:
    kind = "mixed"
  elif "reg_token" not in names:
    kind = "index"
  elif "pos_embed" not in names:
    kind = "dinov3"
  else:
    raise errors.InputError(
        f"{path} is a timm Eva with registers and a position table, which "
        "vit_jax does not read; of timm's Evas it reads the DINOv3 ports "
        "(vit_*_patch16_dinov3*) and the RoPE ViTs (vit_*_rope_*)")
  if kind != "dinov3" and "blocks.0.mlp.fc1_g.weight" in names:
    raise errors.InputError(
        f"{path} is a timm Eva with a SwiGLU MLP and timm's own rotary "
        "embedding (EVA-02), which vit_jax does not read; of timm's Evas it "
        "reads the DINOv3 ports (vit_*_patch16_dinov3*) and the RoPE ViTs "
        "(vit_*_rope_*)")
  return kind


def _rope_channels(head_dim, kind):
  """[head_dim] indices: vit_jax's channel c of a head is timm's channel
  `perm[c]` in a RoPE ViT of `kind` ("index" or "mixed"; module comment
  above)."""
  half = head_dim // 2
  planes = np.arange(half)
  if kind == "index":  # timm's column planes come first, vit_jax's row's.
    planes = (planes + head_dim // 4) % half
  return np.concatenate([2 * planes, 2 * planes + 1])


def _permute_queries_and_keys(tensors, num_heads, perm):
  """`tensors` (timm names) with the query and key channels of each head
  of every fused qkv (and q/k norm) taken in the order `perm`."""
  tensors = dict(tensors)
  for name in [n for n in tensors if n.endswith(".attn.qkv.weight")]:
    attn = name[:-len("qkv.weight")]
    for leaf in ("weight", "bias"):
      value = tensors[attn + "qkv." + leaf]
      width = value.shape[0] // 3
      parts = value.reshape(3, num_heads, width // num_heads,
                            *value.shape[1:])
      parts = np.concatenate([parts[:2, :, perm], parts[2:]])
      tensors[attn + "qkv." + leaf] = parts.reshape(value.shape)
    for norm in ("q_norm", "k_norm"):
      for leaf in ("weight", "bias"):
        key = f"{attn}{norm}.{leaf}"
        if key in tensors:
          tensors[key] = tensors[key][perm]
  return tensors


def from_eva(tensors, kind, num_heads):
  """An Eva's `tensors` of `kind` in timm VisionTransformer's names: its
  layer scales as ls1/ls2.gamma, one fused qkv bias, zero for the key (and
  for all three where the Eva has none, which computes the same), a
  SwiGLU's `fc1_x` as `fc1` (its gate `fc1_g` is the timm layout's); a
  RoPE ViT's query and key channels in vit_jax's order, and its "mixed"
  frequencies one block's each (`blocks.{i}.attn.rope_freqs`)."""
  tensors = dict(tensors)
  for name in [n for n in tensors if n.endswith(".attn.qkv.weight")]:
    attn = name[:-len("qkv.weight")]
    width = tensors[name].shape[0] // 3
    zeros = np.zeros(width, tensors[name].dtype)
    if attn + "qkv.bias" not in tensors:
      tensors[attn + "qkv.bias"] = np.concatenate([
          tensors.pop(attn + "q_bias", zeros), zeros,
          tensors.pop(attn + "v_bias", zeros)])
  if kind in ("index", "mixed"):
    width = tensors["patch_embed.proj.weight"].shape[0]
    tensors = _permute_queries_and_keys(
        tensors, num_heads, _rope_channels(width // num_heads, kind))
  if "rope.freqs" in tensors:
    freqs = tensors.pop("rope.freqs")
    for i in range(freqs.shape[1]):
      tensors[f"blocks.{i}.attn.rope_freqs"] = freqs[:, i]
  return {re.sub(r"\.mlp\.fc1_x\.", ".mlp.fc1.",
                 re.sub(r"\.gamma_([12])$", r".ls\1.gamma", name)): value
          for name, value in tensors.items()}


def eva_family_cannot(flat):
  """The parts of release-layout `flat` that neither transformers'
  DINOv3ViTModel nor timm's Eva holds."""
  return [part for key, part in (
      ("conv_root/kernel", "a hybrid's ResNet stem"),
      ("dist", "a distillation token"),
      ("pre_logits/kernel", "a pre-logits layer"),
      ("fc_norm/scale", "final_norm 'pooled'"),
      (models.POSEMB_2D_KEYS[0], "a 2-D position table"),
      (layouts.MAP_PROBE, "attention pooling (classifier 'map')"),
      (layouts.BLOCK.format(0) + layouts.ATTENTION +
       "/query_norm/scale", "query/key norms")) if key in flat]


def write_eva(path, flat, function, image_size, what):
  """A timm Eva state dict of a model with 2-D RoPE, laid out as timm's
  DINOv3 ports (rope "axial", no position table) or its RoPE ViTs ("index"
  or "mixed", with or without a table) are (`eva_kind`); returns the lines
  that load it. A model that pools the patch tokens writes its first
  register as Eva's class token, which its average leaves out as it
  leaves out the registers: a timm Eva read and written is the same file.
  A DINOv3's query and value biases are written where any is not zero,
  its key bias must be zero (its Eva has none); a RoPE ViT keeps its
  fused bias, its query and key channels in timm's order."""
  kind = function["rope"]
  architecture = models.architecture_of(flat)
  table = models.POSEMB_KEY in flat
  cannot = eva_family_cannot(flat)
  if not kind:
    cannot.append("no 2-D rotary embeddings")
  if kind == "axial" and table:
    cannot.append("a position table beside rope 'axial'")
  if table and layouts.REGISTERS in flat:
    cannot.append("registers beside a position table")
  if function["gelu"] != "exact" and architecture["mlp"] == "gelu":
    cannot.append("the tanh GELU")
  sizes = files.sizes(flat)
  keys = [layouts.BLOCK.format(i) + layouts.ATTENTION +
          "/key/bias" for i in range(sizes["num_layers"])]
  if kind == "axial" and any(np.any(flat.get(key, 0)) for key in keys):
    cannot.append("a key bias (--format=hf writes it)")
  files.refuse(what, "as a timm Eva", cannot)
  flat = dict(flat)
  registers = flat.pop(layouts.REGISTERS, None)
  if "cls" not in flat and registers is not None:
    flat["cls"], registers = registers[:, :1], registers[:, 1:]
  if registers is not None and registers.shape[1]:
    flat[layouts.REGISTERS] = registers
  # A class token's row of zeros is timm's no_embed_class (its RoPE ViTs').
  no_embed_class = table and "cls" in flat and architecture[
      "classifier"] == "token" and not flat[models.POSEMB_KEY][:, 0].any()
  if no_embed_class:
    flat[models.POSEMB_KEY] = flat[models.POSEMB_KEY][:, 1:]
  tensors = layouts.from_release(flat, "timm")
  qkv_bias = kind != "axial"
  if kind == "axial":
    for name in [n for n in tensors if n.endswith(".attn.qkv.bias")]:
      q, _, v = np.split(tensors.pop(name), 3)
      if q.any() or v.any():
        qkv_bias = True
        attn = name[:-len("qkv.bias")]
        tensors[attn + "q_bias"], tensors[attn + "v_bias"] = q, v
    if qkv_bias:  # Every block then has both, zeros included.
      for name in [n for n in tensors if n.endswith(".attn.qkv.weight")]:
        zeros = np.zeros(tensors[name].shape[0] // 3, tensors[name].dtype)
        tensors.setdefault(name[:-len("qkv.weight")] + "q_bias", zeros)
        tensors.setdefault(name[:-len("qkv.weight")] + "v_bias", zeros)
  else:
    perm = _rope_channels(sizes["hidden_size"] // sizes["num_heads"], kind)
    tensors = _permute_queries_and_keys(tensors, sizes["num_heads"],
                                        np.argsort(perm))
    if kind == "mixed":
      tensors["rope.freqs"] = np.stack(
          [tensors.pop(f"blocks.{i}.attn.rope_freqs")
           for i in range(sizes["num_layers"])], axis=1)
  swiglu = architecture["mlp"] == "swiglu"
  tensors = {re.sub(r"\.mlp\.fc1\.", ".mlp.fc1_x." if swiglu else ".mlp.fc1.",
                    re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", name)): value
             for name, value in tensors.items()}
  files.write_safetensors(tensors, path)
  arguments = dict(
      img_size=int(sizes["image_size"] or image_size or
                   EVA_IMAGE_SIZES["dinov3" if kind == "axial" else kind]),
      patch_size=sizes["patch_size"], embed_dim=sizes["hidden_size"],
      depth=sizes["num_layers"], num_heads=sizes["num_heads"],
      mlp_ratio=sizes["mlp_dim"] / sizes["hidden_size"],
      num_classes=sizes["num_classes"],
      global_pool="token" if architecture["classifier"] == "token" else "avg",
      class_token="cls" in flat,
      num_reg_tokens=0 if layouts.REGISTERS not in flat else int(
          flat[layouts.REGISTERS].shape[1]),
      qkv_bias=qkv_bias, use_abs_pos_emb=table, use_rot_pos_emb=True,
      rope_temperature=function["rope_theta"], use_fc_norm=False,
      dynamic_img_size=True)
  if kind == "axial":
    arguments.update(rope_type="dinov3", rope_rotate_half=True)
  else:
    arguments.update(attn_type="rope", rope_type={
        "index": "cat", "mixed": "mixed"}[kind], rope_grid_indexing="xy")
  if swiglu:  # Eva's separate gate and input Linears (its SwiGLU class).
    arguments.update(swiglu_mlp=True, swiglu_align_to=1)
  if no_embed_class:
    arguments["no_embed_class"] = True
  if architecture["layer_scale"] is not None:
    arguments["init_values"] = architecture["layer_scale"]
  return files.timm_lines(path, "eva.Eva", arguments,
                          function["layer_norm_epsilon"])
