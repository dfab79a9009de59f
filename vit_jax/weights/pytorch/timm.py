"""timm's `VisionTransformer` state dicts, one `.safetensors` file each,
read and written: with timm's register tokens, layer scale, query/key
norms and attention pooling where it has them, and DeiT's distilled
models. Its sizes come from the shapes; its head count from the hidden
size of a paper variant (or the caller); its function is timm's (epsilon
1e-6, exact GELU, `fc_norm` for average-pool models). A file of timm's Eva
class is read and written through eva.py.
"""

import numpy as np

from vit_jax import errors, models
from vit_jax.weights.pytorch import eva as eva_lib, files, hf, layouts


def timm_options(path):
  """The models.SOURCE_OPTIONS of a timm .safetensors file, from its header
  (no tensor is read): what `read_timm` then gives. A class token that the
  model does not pool is one more register (`_timm_prefix_tokens`)."""
  shapes = files.read_shapes(path)
  _check_timm(shapes, path)
  eva = eva_lib.eva_kind(shapes, path)
  pooled = _pools_class_token(shapes, eva)
  prefix_tokens = ("cls_token" in shapes) + (
      shapes["reg_token"][1] if "reg_token" in shapes else 0)
  return {**_timm_function(shapes, eva),
          "posemb": "learn" if "pos_embed" in shapes else "none",
          "classifier": ("token" if pooled else
                         "map" if "attn_pool.latent" in shapes else "gap"),
          "num_registers": prefix_tokens - pooled,
          "distill_token": "dist_token" in shapes,
          "layer_scale": 1.0 if any(
              key in shapes for key in ("blocks.0.ls1.gamma",
                                        "blocks.0.gamma_1")) else None,
          "qk_norm": "blocks.0.attn.q_norm.weight" in shapes,
          # timm's DINOv3 ports have none (a zero buffer in its place).
          "key_bias": eva != "dinov3",
          "mlp": "swiglu" if "blocks.0.mlp.fc1_g.weight" in shapes else
                 "gelu"}


def _check_timm(names, path):
  """InputError unless the tensor `names` are a timm VisionTransformer's."""
  if any(k.startswith(("vit.", "embeddings.", "vision_model."))
         for k in names):
    raise errors.InputError(
        f"{path} holds an HF transformers model: give the directory it lies "
        f"in, with its {hf.HF_CONFIG}")
  if "patch_embed.proj.weight" not in names:
    raise errors.InputError(
        f"{path} is no timm VisionTransformer (no patch_embed.proj.weight); "
        f"first keys: {sorted(names)[:6]}")


def _timm_function(keys, eva=None):
  """timm's function, with the pooled features normalised where the file
  has an fc_norm; an Eva's (`eva_lib.eva_kind`) with its rotary
  embedding."""
  function = {**models.FUNCTION_OPTIONS, **files.TIMM_FUNCTION,
              "final_norm": "pooled" if "fc_norm.weight" in keys else
              "tokens"}
  function.update(eva_lib.EVA_FUNCTIONS.get(eva, {}))
  return function


def _pools_class_token(keys, eva):
  """Whether timm's model pools its class token: a VisionTransformer with
  neither fc_norm nor attention pooling does, and so do timm's RoPE ViTs;
  its DINOv3 ports average the patch tokens (global_pool "avg", their
  default in timm)."""
  return "cls_token" in keys and eva != "dinov3" and not any(
      key in keys for key in ("fc_norm.weight", "attn_pool.latent"))


def read_timm(path, num_heads=None):
  """The ViT of a timm state dict in a .safetensors file: a
  VisionTransformer, or an Eva of DINOv3's or a RoPE ViT
  (`eva_lib.eva_kind`)."""
  tensors = files.read_safetensors(path)
  _check_timm(tensors, path)
  eva = eva_lib.eva_kind(tensors, path)
  function = _timm_function(tensors, eva)
  pooled = _pools_class_token(tensors, eva)
  hidden = tensors["patch_embed.proj.weight"].shape[0]
  if eva:
    if not num_heads and hidden % eva_lib.EVA_HEAD_DIM:
      raise errors.InputError(
          f"{path}: a timm Eva of width {hidden}, no multiple of its "
          f"heads' width {eva_lib.EVA_HEAD_DIM}: give its head count "
          "(--num_heads)")
    num_heads = num_heads or eva_lib.EVA_HEADS.get(
        hidden, hidden // eva_lib.EVA_HEAD_DIM)
    tensors = eva_lib.from_eva(tensors, eva, num_heads)
  num_heads = num_heads or files.heads_for_width(hidden)
  flat = layouts.to_release(_timm_prefix_tokens(tensors, pooled), "timm",
                            num_heads)
  if eva == "dinov3":
    flat = files.without_key_bias(flat)
  return files.Read(flat, function,
                    image_size=eva_lib.EVA_IMAGE_SIZES.get(eva),
                    normalization=files.IMAGENET if eva else files.HALF)


def _timm_prefix_tokens(tensors, pooled_token):
  """`tensors` with timm's class and register tokens (its "prefix tokens")
  where vit_jax keeps them.

  timm adds the position embedding to them too unless no_embed_class;
  vit_jax's registers get none, so theirs is folded into the registers
  (a constant added to a constant). A class token that is not what the
  model pools (global_pool "avg" or "map", which read the patch tokens
  only, as timm's default pool_include_prefix=False does) is one more
  register. One it pools keeps its own row of the position embedding,
  zero under no_embed_class. DeiT's distilled models (a `dist_token`)
  keep theirs as vit_jax does: the class and distillation tokens' rows
  ahead of the patches', no registers.
  """
  if "dist_token" in tensors:
    _check_deit(tensors)
    return tensors
  tensors = dict(tensors)
  tokens = [tensors.pop(key) for key in ("cls_token", "reg_token")
            if key in tensors]
  if not tokens:
    return tensors
  prefix = np.concatenate(tokens, axis=1)
  posemb = tensors.get("pos_embed")
  prefix_pos = None  # no_embed_class: none
  if posemb is not None and not files.is_square(posemb.shape[1]):
    # Rows for the prefix tokens too: the grid is the rows after them.
    width = prefix.shape[1]
    prefix_pos, tensors["pos_embed"] = posemb[:, :width], posemb[:, width:]
  if pooled_token:
    tensors["cls_token"], prefix = prefix[:, :1], prefix[:, 1:]
    if posemb is not None:
      cls_pos = (np.zeros_like(posemb[:, :1]) if prefix_pos is None
                 else prefix_pos[:, :1])
      tensors["pos_embed"] = np.concatenate([cls_pos, tensors["pos_embed"]],
                                            axis=1)
      prefix_pos = None if prefix_pos is None else prefix_pos[:, 1:]
  if prefix.shape[1]:
    tensors["reg_token"] = prefix if prefix_pos is None else (
        prefix + prefix_pos)
  return tensors


def _check_deit(tensors):
  """InputError unless a timm model with a distillation token is laid out
  as DeiT's distilled models are (VisionTransformerDistilled): no
  registers, a position table with the class and distillation tokens'
  rows first."""
  posemb = tensors.get("pos_embed")
  if ("reg_token" in tensors or "cls_token" not in tensors or posemb is None
      or not files.is_square(posemb.shape[1] - 2)):
    raise errors.InputError(
        "a timm model with a dist_token that is no DeiT distilled model: "
        "vit_jax reads its class token, distillation token and a position "
        "table with their rows first, and no registers")


def write_timm(path, flat, function, what, image_size=None):
  """A timm state dict; returns the Python lines that load it into timm's
  VisionTransformer (a model with a distillation token: DeiT's
  VisionTransformerDistilled; with 2-D rotary embeddings, its Eva:
  `eva_lib.write_eva`), whose arguments a state dict does not record."""
  if function["rope"]:
    return eva_lib.write_eva(path, flat, function, image_size, what)
  files.check_writable(flat, function, "timm", what)
  sizes = files.sizes(flat)
  architecture = models.architecture_of(flat)
  registers = architecture["num_registers"]
  if registers:
    # timm adds the position embedding to its register tokens too: ours
    # get none, a zero row each.
    posemb = flat[models.POSEMB_KEY]
    first = int("cls" in flat)
    flat = {**flat, models.POSEMB_KEY: np.concatenate([
        posemb[:, :first], np.zeros((1, registers, posemb.shape[2]),
                                    posemb.dtype), posemb[:, first:]], axis=1)}
  files.write_safetensors(layouts.from_release(flat, "timm"), path)
  arguments = dict(
      img_size=sizes["image_size"], patch_size=sizes["patch_size"],
      embed_dim=sizes["hidden_size"], depth=sizes["num_layers"],
      num_heads=sizes["num_heads"],
      mlp_ratio=sizes["mlp_dim"] / sizes["hidden_size"],
      num_classes=sizes["num_classes"], class_token="cls" in flat,
      global_pool={"token": "token", "gap": "avg", "map": "map"}[
          architecture["classifier"]],
      fc_norm=function["final_norm"] == "pooled")
  if registers:
    arguments["reg_tokens"] = registers
  if architecture["layer_scale"] is not None:
    arguments["init_values"] = architecture["layer_scale"]
  if architecture["qk_norm"]:
    arguments["qk_norm"] = True
  if function["gelu"] == "tanh":
    arguments["act_layer"] = "gelu_tanh"
  model_class = ("deit.VisionTransformerDistilled"
                 if architecture["distill_token"]
                 else "vision_transformer.VisionTransformer")
  return files.timm_lines(path, model_class, arguments,
                          function["layer_norm_epsilon"])
