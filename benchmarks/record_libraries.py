"""Records the real libraries' outputs, for tests/test_recorded_libraries.py.

Run by hand, in a virtual environment of its own with torch, timm and
transformers (never the project's; nothing of the package or its tests
needs torch):

  /work/torchvenv/bin/python benchmarks/record_libraries.py \
      --out=tests/fixtures/libraries

For each family of PyTorch-world ViT that vit_jax reads or writes it makes a
SMALL random model (2 blocks, width 48, 4 heads, patch 8, 32 x 32 images;
seeded, and every parameter perturbed by a seeded draw so that nothing is a
trivial initialisation), saves it as its library saves it (transformers:
`save_pretrained`, a directory of config.json and model.safetensors; timm:
its `state_dict()` as .safetensors, and in model.json the
`timm.create_model` name and arguments that build it), and records fixed
inputs and the model's outputs on them, computed in float64 (the float32
weights as saved, `model.double()`, the float32 inputs widened): logits,
pooled features (what the head reads) and the patch tokens of the last
hidden state. SigLIP 2's NaFlex tower also gets two image processors' work
on a few pictures of different aspect ratios (PNG files): the
`pixel_values`, `pixel_attention_mask` and `spatial_shapes` of
transformers' Siglip2ImageProcessor (torchvision) and
Siglip2ImageProcessorPil, and the model's outputs on the former's.
ViTMAEForPreTraining (an MAE encoder and decoder) gets a seeded masking
noise beside its images, and records its loss, pixel predictions, mask,
ids_restore, the encoder's output and the loss's pixel target; its two
fixed sin-cos tables are the library's own, never perturbed.

The release's .npz form is recorded through google-research/
vision_transformer's own model code (vit_jax/models_vit.py there) where a
checkout is given (--vision_transformer=DIR): a second process, the
project's Python (--release_python, which has jax and flax), imports that
file alone (never this project's vit_jax), initialises small models,
perturbs them as above, saves their params as the release's .npz files are
(the params flattened with "/" joining the names, np.savez) and records
their float32 outputs (upstream's computation dtype).

Everything goes under --out, one folder per family (README.md there says
what each file is), and versions.json (with --only, each family recorded
gets a versions.json of its own and the others' stands). Written twice, the files are the
same bytes: every draw is seeded, torch runs on one thread.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess

import numpy as np

# The sizes of every model here.
WIDTH, DEPTH, HEADS, MLP_RATIO, PATCH, SIDE, CLASSES = 48, 2, 4, 2, 8, 32, 5
# Inputs: NHWC float32 in [-1, 1]. "wide" only for models without a
# position table (RoPE), which compute at any grid.
SHAPES = {"square": (SIDE, SIDE), "wide": (24, 40)}
BATCH = 2
# SigLIP 2's NaFlex pictures (height, width) and the processor's budget.
PICTURES = {"tall": (45, 23), "wide": (20, 70), "square": (32, 32)}
MAX_NUM_PATCHES = 16

# Each timm family: (timm.create_model's name, arguments beside the sizes,
# the input shapes it is run on).
TIMM_SIZES = dict(img_size=SIDE, patch_size=PATCH, embed_dim=WIDTH,
                  depth=DEPTH, num_heads=HEADS, mlp_ratio=MLP_RATIO,
                  num_classes=CLASSES)
TIMM_FAMILIES = {
    "timm_vit_token": ("vit_base_patch16_224", {}, ("square",)),
    "timm_vit_map_registers_layerscale_qknorm": (
        "vit_base_patch16_224", dict(reg_tokens=4, init_values=1e-5,
                                     global_pool="map", qk_norm=True),
        ("square",)),
    "timm_vit_avg_fcnorm_registers_no_embed_class": (
        "vit_base_patch16_224", dict(reg_tokens=2, global_pool="avg",
                                     fc_norm=True, no_embed_class=True),
        ("square",)),
    "timm_deit_distilled": ("deit_base_distilled_patch16_224", {},
                            ("square",)),
    "timm_eva_rope_index": ("vit_base_patch16_rope_224",
                            dict(dynamic_img_size=True), ("square", "wide")),
    "timm_eva_rope_mixed": ("vit_base_patch16_rope_mixed_224",
                            dict(dynamic_img_size=True), ("square", "wide")),
    "timm_eva_rope_ape": ("vit_base_patch16_rope_ape_224", {}, ("square",)),
    "timm_eva_dinov3_qkvb": ("vit_small_patch16_dinov3_qkvb", {},
                             ("square", "wide")),
    "timm_eva_dinov3_swiglu": ("vit_huge_plus_patch16_dinov3", {},
                               ("square", "wide")),
    # MAE's pre-trained encoder as timm gives it: the ".mae" tag's config
    # (num_classes=0, over TIMM_SIZES' classes: no head; class token
    # pooled, no fc_norm).
    "timm_vit_mae_encoder": ("vit_base_patch16_224.mae", dict(num_classes=0),
                             ("square",)),
}
HF_FAMILIES = ("hf_vit_classifier", "hf_vit_model_pooler",
               "hf_deit_with_teacher", "hf_dinov2", "hf_dinov2_registers",
               "hf_dinov2_swiglu",
               "hf_dinov3", "hf_siglip", "hf_siglip2_naflex", "hf_vit_mae",
               "hf_vit_mae_norm_pix", "hf_siglip_two_towers",
               "hf_siglip2_two_towers")
# SiglipModel's text tower (the image tower's sizes are the others'): its
# head projects to the image tower's width; TEXTS texts of TEXT_LENGTH
# token ids each, against the BATCH images.
SIGLIP_TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=64,
                   num_hidden_layers=2, num_attention_heads=4,
                   max_position_embeddings=16, projection_size=WIDTH)
TEXTS = 3
# ViTMAEForPreTraining's decoder (sizes of its own) and masking; the
# families differ in norm_pix_loss only.
MAE_DECODER = dict(decoder_hidden_size=32, decoder_num_hidden_layers=2,
                   decoder_num_attention_heads=4, decoder_intermediate_size=64)
MAE_MASK_RATIO = 0.75
MAE_NORM_PIX_LOSS = {"hf_vit_mae": False, "hf_vit_mae_norm_pix": True}
# ViTMAE's fixed sin-cos tables (requires_grad False): never perturbed, so
# that they stay the library's own.
MAE_FIXED = ("vit.embeddings.position_embeddings", "decoder.decoder_pos_embed")
RELEASE_FAMILIES = {  # upstream's VisionTransformer arguments
    "release_token_pre_logits": dict(classifier="token",
                                     representation_size=WIDTH),
    "release_gap": dict(classifier="gap", representation_size=None),
}


def seed_of(family):
  """A seed of its own for each family, stable across runs and Pythons."""
  return sum((i + 1) * ord(c) for i, c in enumerate(family)) % (2 ** 31)


def images_for(family, shapes):
  """{shape name: [BATCH, H, W, 3] float32 in [-1, 1]}."""
  rng = np.random.default_rng(seed_of(family) + 1)
  return {name: rng.uniform(-1, 1, (BATCH, *SHAPES[name], 3)).astype(
      np.float32) for name in shapes}


def perturbation_scale(name, shape):
  """How much of a standard normal draw each parameter gets added: weights
  about 1 / sqrt(fan in) (a trained model's scale, where timm's own init
  is 0.02); tokens, tables and probes 0.5 (at the patch embedding's
  scale); LayerNorm scales, biases, layer scales and RoPE frequencies
  0.2."""
  lower = name.lower()
  if any(part in lower for part in ("token", "pos_embed", "position_embed",
                                    "latent", "probe")):
    return 0.5
  if len(shape) >= 2:
    return 1.0 / float(np.sqrt(np.prod(shape[1:])))
  return 0.2


def perturb(model, seed, keep=()):
  """Adds a seeded draw to every parameter (perturbation_scale), in the
  order of their names; those named in `keep` are left as they are (and
  take no draw)."""
  import torch  # pylint: disable=g-import-not-at-top
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in sorted(model.named_parameters()):
      if name in keep:
        continue
      draw = torch.randn(param.shape, generator=generator,
                         dtype=torch.float64)
      param.add_((perturbation_scale(name, param.shape) * draw).to(
          param.dtype))
  return model


def save_arrays(arrays, path):
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  safetensors.numpy.save_file(
      {key: np.ascontiguousarray(value) for key, value in arrays.items()},
      path, metadata={"format": "np"})


def as_numpy(tensor):
  return tensor.detach().cpu().numpy()


def to_torch(images):
  """NHWC numpy -> NCHW float64 torch."""
  import torch  # pylint: disable=g-import-not-at-top
  return torch.from_numpy(images.transpose(0, 3, 1, 2).astype(np.float64))


def write_json(value, path):
  with open(path, "w") as f:
    json.dump(value, f, indent=2, sort_keys=True)
    f.write("\n")


def record_timm(family, out):
  import safetensors.torch  # pylint: disable=g-import-not-at-top
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  name, options, shapes = TIMM_FAMILIES[family]
  kwargs = {**TIMM_SIZES, **options}
  torch.manual_seed(seed_of(family))
  model = timm.create_model(name, pretrained=False, **kwargs).eval()
  perturb(model, seed_of(family))
  os.makedirs(out, exist_ok=True)
  safetensors.torch.save_file(
      {key: value.contiguous() for key, value in model.state_dict().items()},
      os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
  model = model.double()
  inputs = images_for(family, shapes)
  headless = model.num_classes == 0  # Its head an Identity: no logits.
  outputs = {}
  with torch.no_grad():
    for shape, images in inputs.items():
      x = to_torch(images)
      tokens = model.forward_features(x)
      features = model.forward_head(tokens, pre_logits=True)
      if headless:
        pooled = model(x)
        if not (torch.equal(pooled, model.forward_head(tokens)) and
                torch.equal(pooled, features)):
          raise RuntimeError(f"{family}: model(x) is not the pooled "
                             "features")
      else:
        outputs[f"{shape}/logits"] = as_numpy(model.forward_head(tokens))
      outputs[f"{shape}/features"] = as_numpy(features)
      outputs[f"{shape}/patch_tokens"] = as_numpy(
          tokens[:, model.num_prefix_tokens:])
  save_arrays(inputs, os.path.join(out, "inputs.safetensors"))
  save_arrays(outputs, os.path.join(out, "outputs.safetensors"))
  described = {
      "logits": "model.forward_head(model.forward_features(x))",
      "features": "model.forward_head(model.forward_features(x), "
                  "pre_logits=True)",
      "patch_tokens": "model.forward_features(x)[:, "
                      "model.num_prefix_tokens:]"}
  if headless:
    del described["logits"]
    described["features"] = (
        "model(x) = model.forward_head(model.forward_features(x)) (no "
        "head: num_classes=0, an Identity; the same as with "
        "pre_logits=True)")
  write_json({
      "library": "timm", "class": type(model).__name__,
      "create_model": name, "kwargs": kwargs, "num_heads": HEADS,
      "num_prefix_tokens": model.num_prefix_tokens,
      "outputs": described,
  }, os.path.join(out, "model.json"))


def _hf_model(family):
  """(the model, what its outputs are: {output: expression})."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers as t  # pylint: disable=g-import-not-at-top
  sizes = dict(hidden_size=WIDTH, num_hidden_layers=DEPTH,
               num_attention_heads=HEADS, intermediate_size=WIDTH * MLP_RATIO,
               image_size=SIDE, patch_size=PATCH)
  labels = dict(id2label={i: f"class {i}" for i in range(CLASSES)},
                label2id={f"class {i}": i for i in range(CLASSES)})
  if family == "hf_vit_classifier":  # The hub's function: gelu, 1e-12.
    return t.ViTForImageClassification(t.ViTConfig(**sizes, **labels)), {
        "logits": "model(x).logits",
        "features": "model.vit(x).last_hidden_state[:, 0]",
        "patch_tokens": "model.vit(x).last_hidden_state[:, 1:]"}
  if family == "hf_vit_model_pooler":
    return t.ViTModel(t.ViTConfig(**sizes, hidden_act="gelu_pytorch_tanh",
                                  layer_norm_eps=1e-6),
                      add_pooling_layer=True), {
        "features": "model(x).pooler_output",
        "patch_tokens": "model(x).last_hidden_state[:, 1:]"}
  if family == "hf_deit_with_teacher":
    return t.DeiTForImageClassificationWithTeacher(
        t.DeiTConfig(**sizes, **labels)), {
        "logits": "model(x).logits (the two heads' mean)",
        "features": "model.deit(x).last_hidden_state[:, :2].mean(1)",
        "patch_tokens": "model.deit(x).last_hidden_state[:, 2:]"}
  if family == "hf_dinov2":
    sizes.pop("intermediate_size")
    return t.Dinov2Model(t.Dinov2Config(**sizes, mlp_ratio=MLP_RATIO)), {
        "features": "model(x).pooler_output",
        "patch_tokens": "model(x).last_hidden_state[:, 1:]"}
  if family == "hf_dinov2_swiglu":  # DINOv2-g's MLP (hub: weights_in)
    sizes.pop("intermediate_size")
    return t.Dinov2Model(t.Dinov2Config(**sizes, mlp_ratio=MLP_RATIO,
                                        use_swiglu_ffn=True)), {
        "features": "model(x).pooler_output",
        "patch_tokens": "model(x).last_hidden_state[:, 1:]"}
  if family == "hf_dinov2_registers":
    sizes.pop("intermediate_size")
    return t.Dinov2WithRegistersModel(t.Dinov2WithRegistersConfig(
        **sizes, mlp_ratio=MLP_RATIO, num_register_tokens=4)), {
        "features": "model(x).pooler_output",
        "patch_tokens": "model(x).last_hidden_state[:, 5:]"}
  if family == "hf_dinov3":
    return t.DINOv3ViTModel(t.DINOv3ViTConfig(
        **sizes, num_register_tokens=4)), {
        "features": "model(x).pooler_output",
        "patch_tokens": "model(x).last_hidden_state[:, 5:]"}
  if family == "hf_siglip":
    return t.SiglipVisionModel(t.SiglipVisionConfig(**sizes)), {
        "features": "model(x).pooler_output",
        "patch_tokens": "model(x).last_hidden_state"}
  if family == "hf_siglip_two_towers":
    model = t.SiglipModel(t.SiglipConfig(vision_config=sizes,
                                         text_config=SIGLIP_TEXT))
    # SigLIP's t' = log 10 (torch's init draws it from N(0, 1)), so that
    # the logits spread over units; b so that they are of both signs.
    with torch.no_grad():
      model.logit_scale.fill_(float(np.log(10.0)))
      model.logit_bias.fill_(-1.0)
    return model, {
        "logits_per_image": "model(input_ids=ids, pixel_values=x)."
                            "logits_per_image: [images, texts]",
        "image_embeds": "model(...).image_embeds (normalised)",
        "text_embeds": "model(...).text_embeds (normalised)"}
  if family == "hf_siglip2_two_towers":
    sizes.pop("image_size")
    model = t.Siglip2Model(t.Siglip2Config(
        vision_config=dict(sizes, num_patches=(SIDE // PATCH) ** 2),
        text_config=SIGLIP_TEXT))
    with torch.no_grad():  # As hf_siglip_two_towers'.
      model.logit_scale.fill_(float(np.log(10.0)))
      model.logit_bias.fill_(-1.0)
    return model, {
        "logits_per_image": "model(input_ids=ids, pixel_values=patches, "
                            "pixel_attention_mask=mask, spatial_shapes="
                            "grids).logits_per_image: [images, texts]",
        "image_embeds": "model(...).image_embeds (normalised)",
        "text_embeds": "model(...).text_embeds (normalised)"}
  if family == "hf_siglip2_naflex":
    sizes.pop("image_size")
    return t.Siglip2VisionModel(t.Siglip2VisionConfig(
        **sizes, num_patches=(SIDE // PATCH) ** 2)), {
        "features": "model(**processed).pooler_output",
        "patch_tokens": "model(**processed).last_hidden_state (padding "
                        "rows included)"}
  if family in MAE_NORM_PIX_LOSS:  # The hub's function: gelu, 1e-12.
    model = t.ViTMAEForPreTraining(t.ViTMAEConfig(
        **sizes, **MAE_DECODER, mask_ratio=MAE_MASK_RATIO,
        norm_pix_loss=MAE_NORM_PIX_LOSS[family]))
    _mae_sincos_tables(model)
    target = "model.patchify(x): [B, 16, 192], each patch's values in " \
             "(row, column, channel) order, channel fastest"
    if MAE_NORM_PIX_LOSS[family]:
      target += "; then (target - mean) / (var + 1e-6) ** 0.5, the mean " \
                "and the unbiased variance (torch's var, N - 1) over a " \
                "patch's 192 values"
    return model, {
        "loss": "model(x, noise=noise).loss, a scalar (0-d in torch, "
                "stored as shape [1]): ((logits - target) ** 2).mean(-1), "
                "times mask, summed, over mask.sum()",
        "logits": "model(x, noise=noise).logits: the decoder's per-patch "
                  "pixel predictions, class token dropped, in the image's "
                  "patch order (unshuffled), [B, 16, 192]",
        "mask": "model(x, noise=noise).mask: 1 where a patch is masked "
                "(removed), 0 where kept, in the image's patch order "
                "(float32 as the library makes it)",
        "ids_restore": "model(x, noise=noise).ids_restore: "
                       "argsort(argsort(noise, 1), 1) (int64)",
        "last_hidden_state": "model.vit(x, noise=noise).last_hidden_state: "
                             "the encoder's output (final layernorm "
                             "applied) on the class token then the 4 kept "
                             "patches, in ascending noise order",
        "target": target}
  raise ValueError(family)


def _two_towers(family, model):
  """SiglipModel's or Siglip2Model's inputs (images or NaFlex patches,
  token ids) and outputs (float64), as _hf_model's description says."""
  import torch  # pylint: disable=g-import-not-at-top
  images = images_for(family, ("square",))["square"]
  ids = np.random.default_rng(seed_of(family) + 2).integers(
      0, SIGLIP_TEXT["vocab_size"],
      (TEXTS, SIGLIP_TEXT["max_position_embeddings"])).astype(np.int32)
  texts = torch.from_numpy(ids).long()
  if family == "hf_siglip_two_towers":
    inputs = {"square/images": images, "square/token_ids": ids}
    with torch.no_grad():
      result = model(input_ids=texts, pixel_values=to_torch(images))
  else:  # NaFlex: a 4 x 4 grid and a 2 x 6 one (4 padding patches).
    grids = np.array([[4, 4], [2, 6]], np.int64)
    patches = np.random.default_rng(seed_of(family) + 3).uniform(
        -1, 1, (BATCH, 16, PATCH * PATCH * 3)).astype(np.float32)
    mask = (np.arange(16)[None] < grids.prod(1)[:, None]).astype(np.int32)
    patches = patches * mask[..., None]
    inputs = {"square/patches": patches, "square/grids": grids.astype(
        np.int32), "square/mask": mask, "square/token_ids": ids}
    with torch.no_grad():
      result = model(input_ids=texts,
                     pixel_values=torch.from_numpy(patches).double(),
                     pixel_attention_mask=torch.from_numpy(mask),
                     spatial_shapes=torch.from_numpy(grids))
  return inputs, {f"square/{key}": as_numpy(getattr(result, key)) for key in (
      "logits_per_image", "image_embeds", "text_embeds")}


def _mae_sincos_tables(model):
  """Fills ViTMAE's two fixed sin-cos tables (and the class and mask
  tokens, the patch projection) by the library's own initialize_weights:
  transformers 5's post_init leaves both tables zero in a model it builds
  (ViTMAEEmbeddings.initialize_weights returns early, its projection
  already initialised; _init_weights zeroes the decoder's table); where
  they are loaded from a checkpoint the file's values stand."""
  embeddings = model.vit.embeddings
  projection = embeddings.patch_embeddings.projection
  projection._is_hf_initialized = False  # pylint: disable=protected-access
  embeddings.initialize_weights()
  projection._is_hf_initialized = True  # pylint: disable=protected-access
  model.decoder.initialize_weights(embeddings.patch_embeddings.num_patches)
  for name in MAE_FIXED:
    if not model.get_parameter(name).detach().any():
      raise RuntimeError(f"{name} is still zero")


HF_SHAPES = {"hf_dinov3": ("square", "wide")}


def _hf_outputs(family, model, x):
  """{output: numpy} of an HF model on NCHW float64 `x`."""
  if family == "hf_vit_classifier":
    hidden = model.vit(x).last_hidden_state
    return {"logits": model(x).logits, "features": hidden[:, 0],
            "patch_tokens": hidden[:, 1:]}
  if family == "hf_deit_with_teacher":
    hidden = model.deit(x).last_hidden_state
    return {"logits": model(x).logits,
            "features": hidden[:, :2].mean(1), "patch_tokens": hidden[:, 2:]}
  out = model(x)
  prefix = {"hf_vit_model_pooler": 1, "hf_dinov2": 1, "hf_dinov2_swiglu": 1,
            "hf_dinov2_registers": 5, "hf_dinov3": 5, "hf_siglip": 0}[family]
  return {"features": out.pooler_output,
          "patch_tokens": out.last_hidden_state[:, prefix:]}


def record_hf(family, out):
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed_of(family))
  model, described = _hf_model(family)
  model = perturb(model.eval(), seed_of(family),
                  keep=MAE_FIXED if family in MAE_NORM_PIX_LOSS else ())
  os.makedirs(out, exist_ok=True)
  model.save_pretrained(os.path.join(out, "hf"))
  model = model.double()
  extra = {}
  if family == "hf_siglip2_naflex":
    inputs, outputs = _siglip2_naflex(model, out)
  elif family in ("hf_siglip_two_towers", "hf_siglip2_two_towers"):
    inputs, outputs = _two_towers(family, model)
    extra = {"num_text_heads": SIGLIP_TEXT["num_attention_heads"]}
  elif family in MAE_NORM_PIX_LOSS:
    inputs, outputs = _mae(family, model)
    extra = {"decoder": {key.replace("decoder_", "", 1): value
                         for key, value in MAE_DECODER.items()},
             "mask_ratio": MAE_MASK_RATIO,
             "norm_pix_loss": MAE_NORM_PIX_LOSS[family],
             "not_perturbed": list(MAE_FIXED)}
  else:
    inputs = images_for(family, HF_SHAPES.get(family, ("square",)))
    outputs = {}
    with torch.no_grad():
      for shape, images in inputs.items():
        for key, value in _hf_outputs(family, model, to_torch(images)).items():
          outputs[f"{shape}/{key}"] = as_numpy(value)
  save_arrays(inputs, os.path.join(out, "inputs.safetensors"))
  save_arrays(outputs, os.path.join(out, "outputs.safetensors"))
  # pylint: disable-next=protected-access
  attention = model.config._attn_implementation
  write_json({"library": "transformers", "class": type(model).__name__,
              "num_heads": HEADS, "attn_implementation": attention,
              "outputs": described, **extra},
             os.path.join(out, "model.json"))


def _mae(family, model):
  """ViTMAEForPreTraining's inputs (the images, the masking noise) and
  outputs (float64), as _hf_model's description says."""
  import torch  # pylint: disable=g-import-not-at-top
  images = images_for(family, ("square",))["square"]
  patches = (SIDE // PATCH) ** 2
  noise = np.random.default_rng(seed_of(family) + 1).random(
      (BATCH, patches)).astype(np.float32)
  inputs = {"square/images": images, "square/noise": noise}
  x, widened = to_torch(images), torch.from_numpy(noise.astype(np.float64))
  with torch.no_grad():
    result = model(x, noise=widened)
    hidden = model.vit(x, noise=widened).last_hidden_state
    # The loss's target, as ViTMAEForPreTraining.forward makes it.
    target = model.patchify(x)
    if model.config.norm_pix_loss:
      mean = target.mean(dim=-1, keepdim=True)
      var = target.var(dim=-1, keepdim=True)
      target = (target - mean) / (var + 1.0e-6) ** 0.5
    loss = (((result.logits - target) ** 2).mean(-1) * result.mask).sum() / (
        result.mask.sum())
    if not torch.equal(loss, result.loss):
      raise RuntimeError(f"the target does not give the loss: {loss} "
                         f"!= {result.loss}")
  outputs = {"loss": result.loss, "logits": result.logits,
             "mask": result.mask, "ids_restore": result.ids_restore,
             "last_hidden_state": hidden, "target": target}
  return inputs, {f"square/{key}": as_numpy(value)
                  for key, value in outputs.items()}


def picture(name):
  """A uint8 RGB picture of PICTURES' size: smooth gradients and waves, a
  little seeded noise."""
  height, width = PICTURES[name]
  rows, cols = np.mgrid[0:height, 0:width].astype(np.float64)
  rng = np.random.default_rng(seed_of(name))
  channels = [
      128 + 100 * np.sin(rows / 5.0 + cols / 9.0),
      255 * cols / max(width - 1, 1),
      128 + 90 * np.cos(np.hypot(rows - height / 2, cols - width / 3) / 4.0),
  ]
  image = np.stack(channels, axis=-1) + rng.normal(0, 12, (height, width, 3))
  return np.clip(np.round(image), 0, 255).astype(np.uint8)


def _siglip2_naflex(model, out):
  """SigLIP 2's pictures through both image processors (their outputs),
  and the model on the torchvision one's (float64)."""
  import PIL.Image  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers as t  # pylint: disable=g-import-not-at-top
  names = list(PICTURES)
  for name in names:
    PIL.Image.fromarray(picture(name)).save(
        os.path.join(out, f"picture_{name}.png"))
  pictures = [PIL.Image.open(os.path.join(out, f"picture_{name}.png"))
              .convert("RGB") for name in names]
  inputs = {}
  processed = None
  for key, kind in (("torchvision", t.Siglip2ImageProcessor),
                    ("pil", t.Siglip2ImageProcessorPil)):
    processor = kind(patch_size=PATCH, max_num_patches=MAX_NUM_PATCHES)
    batch = processor(images=pictures, return_tensors="pt")
    if key == "torchvision":
      processor.save_pretrained(os.path.join(out, "hf"))
      processed = batch
    inputs[f"{key}/pixel_values"] = as_numpy(batch["pixel_values"]).astype(
        np.float32)
    inputs[f"{key}/pixel_attention_mask"] = as_numpy(
        batch["pixel_attention_mask"]).astype(np.int32)
    inputs[f"{key}/spatial_shapes"] = as_numpy(
        batch["spatial_shapes"]).astype(np.int32)
  with torch.no_grad():
    result = model(pixel_values=processed["pixel_values"].double(),
                   pixel_attention_mask=processed["pixel_attention_mask"],
                   spatial_shapes=processed["spatial_shapes"])
  outputs = {"naflex/features": as_numpy(result.pooler_output),
             "naflex/patch_tokens": as_numpy(result.last_hidden_state)}
  write_json({"pictures": names, "max_num_patches": MAX_NUM_PATCHES,
              "patch_size": PATCH}, os.path.join(out, "pictures.json"))
  return inputs, outputs


# The release's code, run by the project's Python (--release_python): it
# imports google-research/vision_transformer's models_vit.py as the package
# `vit_jax` of that checkout, so this project's vit_jax is never imported.
RELEASE_SCRIPT = r"""
import json, sys, types
import numpy as np
checkout, out, families = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
package = types.ModuleType("vit_jax")
package.__path__ = [checkout + "/vit_jax"]
sys.modules["vit_jax"] = package
import flax, jax, ml_collections
from vit_jax import models_vit
sizes = json.loads(sys.argv[4])
recorded = {}
for family, options in families.items():
  seed, images = options.pop("seed"), np.load(options.pop("images"))
  model = models_vit.VisionTransformer(
      num_classes=sizes["classes"], patches=ml_collections.ConfigDict(
          {"size": (sizes["patch"], sizes["patch"])}),
      transformer=dict(num_layers=sizes["depth"],
                       mlp_dim=sizes["width"] * sizes["mlp_ratio"],
                       num_heads=sizes["heads"], dropout_rate=0.0,
                       attention_dropout_rate=0.0),
      hidden_size=sizes["width"], **options)
  params = model.init(jax.random.PRNGKey(seed), images[:1],
                      train=False)["params"]
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  rng = np.random.default_rng(seed)
  perturbed = {}
  for name in sorted(flat):
    value = np.asarray(flat[name], np.float64)
    base = name.rsplit("/", 1)[-1]
    if name in ("cls", "Transformer/posembed_input/pos_embedding"):
      scale = 0.5
    elif base == "kernel":
      scale = 1 / np.sqrt(np.prod(value.shape[:-1]))
      if value.ndim == 3 and name.endswith("/out/kernel"):
        scale = 1 / np.sqrt(np.prod(value.shape[:2]))
      elif value.ndim == 3:
        scale = 1 / np.sqrt(value.shape[0])
    else:
      scale = 0.2
    perturbed[name] = (value + scale * rng.standard_normal(value.shape)
                       ).astype(np.float32)
  np.savez(f"{out}/{family}/model.npz", **perturbed)
  params = flax.traverse_util.unflatten_dict(
      {k: jax.numpy.asarray(v) for k, v in perturbed.items()}, sep="/")
  logits = model.apply({"params": params}, images, train=False)
  # What the head reads: the output of pre_logits (an IdentityLayer
  # without a representation_size; else a Dense, whose tanh the head
  # reads), captured as flax records a module's output.
  _, state = model.apply({"params": params}, images, train=False,
                         capture_intermediates=lambda m, _: m.name in (
                             "pre_logits", "Transformer"))
  inter = state["intermediates"]
  tokens = inter["Transformer"]["__call__"][0]
  prefix = 1 if options["classifier"] == "token" else 0
  features = inter["pre_logits"]["__call__"][0]
  if options["representation_size"]:  # The Dense's output, then its tanh.
    features = jax.numpy.tanh(features)
  np.savez(f"{out}/{family}/outputs.npz", logits=np.asarray(logits),
           features=np.asarray(features),
           patch_tokens=np.asarray(tokens[:, prefix:]))
  recorded[family] = str(logits.dtype)
print(json.dumps({"jax": jax.__version__, "flax": flax.__version__,
                  "dtypes": recorded}))
"""


def record_release(out, checkout, python):
  """The release families (RELEASE_FAMILIES) through upstream's code;
  returns what the second process says of itself (jax, flax versions)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  families = {}
  with tempfile.TemporaryDirectory() as scratch:
    for family, options in RELEASE_FAMILIES.items():
      os.makedirs(os.path.join(out, family), exist_ok=True)
      images = images_for(family, ("square",))
      np.save(os.path.join(scratch, f"{family}.npy"), images["square"])
      families[family] = {**options, "seed": seed_of(family),
                          "images": os.path.join(scratch, f"{family}.npy")}
    sizes = dict(classes=CLASSES, patch=PATCH, depth=DEPTH, width=WIDTH,
                 mlp_ratio=MLP_RATIO, heads=HEADS)
    done = subprocess.run(
        [python, "-c", RELEASE_SCRIPT, checkout, out, json.dumps(families),
         json.dumps(sizes)], capture_output=True, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if done.returncode:
      raise RuntimeError(f"upstream's models_vit.py did not run:\n"
                         f"{done.stderr[-4000:]}")
    said = json.loads(done.stdout.strip().splitlines()[-1])
  for family, options in RELEASE_FAMILIES.items():
    directory = os.path.join(out, family)
    outputs = dict(np.load(os.path.join(directory, "outputs.npz")))
    os.remove(os.path.join(directory, "outputs.npz"))
    save_arrays(images_for(family, ("square",)),
                os.path.join(directory, "inputs.safetensors"))
    save_arrays({f"square/{key}": value for key, value in outputs.items()},
                os.path.join(directory, "outputs.safetensors"))
    write_json({"library": "google-research/vision_transformer",
                "class": "models_vit.VisionTransformer",
                "kwargs": {**options, "hidden_size": WIDTH,
                           "patches": {"size": [PATCH, PATCH]},
                           "num_classes": CLASSES,
                           "transformer": {
                               "num_layers": DEPTH,
                               "mlp_dim": WIDTH * MLP_RATIO,
                               "num_heads": HEADS}},
                "num_heads": HEADS, "dtype": said["dtypes"][family],
                "outputs": {
                    "logits": "model.apply(params, x, train=False)",
                    "features": "what its head reads: the output of its "
                                "pre_logits layer (tanh of the Dense's, "
                                "with a representation_size)",
                    "patch_tokens": "the output of its Transformer "
                                    "(encoder_norm applied), patches"}},
               os.path.join(directory, "model.json"))
  return said


def checkout_commit(checkout):
  done = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"],
                        capture_output=True, text=True)
  return done.stdout.strip() or None


def versions(release):
  """The versions of what the recording ran with; a library the families
  recorded did not need may be absent from the environment ("absent")."""
  import importlib  # pylint: disable=g-import-not-at-top
  found = {"python": platform.python_version()}
  for name, module in (("torch", "torch"), ("torchvision", "torchvision"),
                       ("timm", "timm"), ("transformers", "transformers"),
                       ("safetensors", "safetensors"), ("numpy", "numpy"),
                       ("pillow", "PIL")):
    try:
      found[name] = importlib.import_module(module).__version__
    except ImportError:
      found[name] = "absent"
  if release:
    found.update(release)
  return found


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--only", default="",
                      help="comma-separated families (default: all)")
  parser.add_argument(
      "--vision_transformer", default="",
      help="a checkout of google-research/vision_transformer; without, the "
           "release families are left as they are")
  parser.add_argument(
      "--release_python", default=os.path.join(
          os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
          ".venv", "bin", "python"),
      help="a Python with jax and flax, to run upstream's models_vit.py")
  args = parser.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  only = set(filter(None, args.only.split(",")))
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  for family in TIMM_FAMILIES:
    if not only or family in only:
      record_timm(family, os.path.join(out, family))
      print("recorded", family)
  for family in HF_FAMILIES:
    if not only or family in only:
      record_hf(family, os.path.join(out, family))
      print("recorded", family)
  release = None
  if args.vision_transformer and (not only or only & set(RELEASE_FAMILIES)):
    said = record_release(out, os.path.abspath(args.vision_transformer),
                          args.release_python)
    release = {"jax (release families)": said["jax"],
               "flax (release families)": said["flax"],
               "google-research/vision_transformer": checkout_commit(
                   args.vision_transformer)}
    print("recorded", ", ".join(RELEASE_FAMILIES))
  found = versions(release)
  if only:  # The others' record stands: these families' goes beside them.
    for family in only - set(RELEASE_FAMILIES):
      write_json(found, os.path.join(out, family, "versions.json"))
    print(f"wrote {out} ({datetime.date.today()})")
    return
  path = os.path.join(out, "versions.json")
  if release is None and os.path.exists(path):  # Keep the release's record.
    with open(path) as f:
      found.update({key: value for key, value in json.load(f).items()
                    if "release" in key or "vision_transformer" in key})
  write_json(found, path)
  print(f"wrote {out} ({datetime.date.today()})")


if __name__ == "__main__":
  main()
