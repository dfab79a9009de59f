"""Today's PyTorch-world ViTs: transformers' SigLIP and SigLIP 2 image
towers, DINOv2 with and without registers, and timm's VisionTransformer
with register tokens, layer scale, query/key norms and attention pooling.

As in test_torch_interchange.py, the files are built with numpy in the key
names and shapes that transformers and timm document (torch stays out of
the tests), and our logits are checked against tests/reference_vit.py's
float64 forwards, which read those names themselves (each checked against
the real libraries when it was written). A source with no classification
head (SigLIP's towers, DINOv2) gets a random one: the reference applies the
same to its pooled features.
"""

import dataclasses
import json

import flax
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests import reference_vit
from tests.test_finetune import flat, start_of
from tests.test_torch_interchange import (
  CLASSES,
  HEADS,
  LAYERS,
  MLP,
  PATCH,
  SIDE,
  WIDTH,
  assert_options_from_headers,
  assert_same_tensors,
  images,
  logits_of,
  random_tensors,
  write_hf_dir,
)
from tests.util import (
  as_siglip_tower,
  metric_rows,
  randomize,
  run_training,
  small_config,
)
from vit_jax import errors, models
from vit_jax.models import naflex
from vit_jax.runs import settings
from vit_jax.weights import exports, pretrained
from vit_jax.weights.pytorch import files

# The digits model's side and patch (configs/digits.py), for the fine-tunes.
DIGITS_SIDE = 8
STEPS = 100  # of the fine-tunes
REGISTERS = 4


def _linear(shapes, name, out, inp):
  shapes[name + ".weight"], shapes[name + ".bias"] = (out, inp), (out,)


def _norm(shapes, name, width=WIDTH):
  shapes[name + ".weight"] = shapes[name + ".bias"] = (width,)


def siglip_shapes(prefix="vision_model.", siglip2=False, head=True,
                  side=SIDE, text_tower=False):
  """transformers' SiglipVisionModel (or Siglip2VisionModel) state dict:
  the hub's files put "vision_model." before every name, transformers 5.23
  saves a SiglipVisionModel without it. SigLIP 2's patch embedding is a
  Linear over flattened patches. A two-tower SiglipModel has a text tower
  and the logit scale and bias beside."""
  tokens = (side // PATCH) ** 2
  shapes = {}
  if siglip2:
    _linear(shapes, "embeddings.patch_embedding", WIDTH, PATCH * PATCH * 3)
  else:
    shapes["embeddings.patch_embedding.weight"] = (WIDTH, 3, PATCH, PATCH)
    shapes["embeddings.patch_embedding.bias"] = (WIDTH,)
  shapes["embeddings.position_embedding.weight"] = (tokens, WIDTH)
  for i in range(LAYERS):
    block = f"encoder.layers.{i}."
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
      _linear(shapes, f"{block}self_attn.{name}", WIDTH, WIDTH)
    _linear(shapes, block + "mlp.fc1", MLP, WIDTH)
    _linear(shapes, block + "mlp.fc2", WIDTH, MLP)
    _norm(shapes, block + "layer_norm1")
    _norm(shapes, block + "layer_norm2")
  _norm(shapes, "post_layernorm")
  if head:  # The attention-pooling head (a torch nn.MultiheadAttention).
    shapes["head.probe"] = (1, 1, WIDTH)
    shapes["head.attention.in_proj_weight"] = (3 * WIDTH, WIDTH)
    shapes["head.attention.in_proj_bias"] = (3 * WIDTH,)
    _linear(shapes, "head.attention.out_proj", WIDTH, WIDTH)
    _norm(shapes, "head.layernorm")
    _linear(shapes, "head.mlp.fc1", MLP, WIDTH)
    _linear(shapes, "head.mlp.fc2", WIDTH, MLP)
  shapes = {prefix + key: shape for key, shape in shapes.items()}
  if text_tower:
    text = "text_model."
    shapes[text + "embeddings.token_embedding.weight"] = (50, WIDTH)
    shapes[text + "embeddings.position_embedding.weight"] = (8, WIDTH)
    for i in range(LAYERS):
      block = f"{text}encoder.layers.{i}."
      for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        _linear(shapes, f"{block}self_attn.{name}", WIDTH, WIDTH)
      _linear(shapes, block + "mlp.fc1", MLP, WIDTH)
      _linear(shapes, block + "mlp.fc2", WIDTH, MLP)
      _norm(shapes, block + "layer_norm1")
      _norm(shapes, block + "layer_norm2")
    _norm(shapes, text + "final_layer_norm")
    _linear(shapes, text + "head", WIDTH, WIDTH)
    shapes["logit_scale"] = shapes["logit_bias"] = (1,)
  return shapes


def siglip_config(siglip2=False, two_tower=False, side=SIDE, **more):
  vision = {"hidden_size": WIDTH, "intermediate_size": MLP,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6,
            "patch_size": PATCH, "num_channels": 3, "vision_use_head": True}
  if siglip2:
    vision["num_patches"] = (side // PATCH) ** 2
  else:
    vision["image_size"] = side
  vision.update(more)
  family = "siglip2" if siglip2 else "siglip"
  if not two_tower:
    return {"model_type": family + "_vision_model", **vision}
  return {"model_type": family, "vision_config": vision,
          "text_config": {"hidden_size": WIDTH, "intermediate_size": MLP,
                          "num_hidden_layers": LAYERS,
                          "num_attention_heads": HEADS, "vocab_size": 50,
                          "max_position_embeddings": 8}}


DINOV2_ATTENTION = {  # the hub's names -> transformers 5.23's in-memory ones
    "attention.attention.query": "attention.q_proj",
    "attention.attention.key": "attention.k_proj",
    "attention.attention.value": "attention.v_proj",
    "attention.output.dense": "attention.o_proj",
}


def dinov2_shapes(registers=0, names="hub", swiglu=False, side=SIDE):
  """transformers' Dinov2Model / Dinov2WithRegistersModel state dict, the
  attention in the hub's names (what save_pretrained writes) or in
  transformers 5.23's own (its model.state_dict()'s)."""
  tokens = (side // PATCH) ** 2
  shapes = {"embeddings.cls_token": (1, 1, WIDTH),
            "embeddings.mask_token": (1, WIDTH),
            "embeddings.position_embeddings": (1, 1 + tokens, WIDTH),
            "embeddings.patch_embeddings.projection.weight":
                (WIDTH, 3, PATCH, PATCH),
            "embeddings.patch_embeddings.projection.bias": (WIDTH,)}
  if registers:
    shapes["embeddings.register_tokens"] = (1, registers, WIDTH)
  for i in range(LAYERS):
    block = f"encoder.layer.{i}."
    for name in DINOV2_ATTENTION:
      _linear(shapes, block + (DINOV2_ATTENTION[name] if names == "5.23"
                               else name), WIDTH, WIDTH)
    if swiglu:  # DINOv2-g's SwiGLU MLP, in the hub's names.
      _linear(shapes, block + "mlp.weights_in", 2 * MLP, WIDTH)
      _linear(shapes, block + "mlp.weights_out", WIDTH, MLP)
    else:
      _linear(shapes, block + "mlp.fc1", MLP, WIDTH)
      _linear(shapes, block + "mlp.fc2", WIDTH, MLP)
    _norm(shapes, block + "norm1")
    _norm(shapes, block + "norm2")
    shapes[block + "layer_scale1.lambda1"] = (WIDTH,)
    shapes[block + "layer_scale2.lambda1"] = (WIDTH,)
  _norm(shapes, "layernorm")
  return shapes


def dinov2_config(registers=0, side=SIDE, **more):
  return {"model_type": ("dinov2_with_registers" if registers else "dinov2"),
          "hidden_size": WIDTH, "num_hidden_layers": LAYERS,
          "num_attention_heads": HEADS, "mlp_ratio": MLP // WIDTH,
          "hidden_act": "gelu", "layer_norm_eps": 1e-6, "image_size": side,
          "patch_size": PATCH, "num_channels": 3, "qkv_bias": True,
          "layerscale_value": 1.0, "use_swiglu_ffn": False,
          **({"num_register_tokens": registers} if registers else {}),
          **more}


def timm_today_shapes(class_token=True, reg_tokens=0, no_embed_class=False,
                      qk_norm=False, init_values=None, global_pool="token",
                      fc_norm=None, side=SIDE):
  """timm's VisionTransformer state dict with today's options, as timm
  1.0 names and shapes them for these constructor arguments."""
  tokens = (side // PATCH) ** 2
  num_prefix = int(class_token) + reg_tokens
  shapes = {"patch_embed.proj.weight": (WIDTH, 3, PATCH, PATCH),
            "patch_embed.proj.bias": (WIDTH,),
            "pos_embed": (1, tokens + (0 if no_embed_class else num_prefix),
                          WIDTH)}
  if class_token:
    shapes["cls_token"] = (1, 1, WIDTH)
  if reg_tokens:
    shapes["reg_token"] = (1, reg_tokens, WIDTH)
  for i in range(LAYERS):
    block = f"blocks.{i}."
    _linear(shapes, block + "attn.qkv", 3 * WIDTH, WIDTH)
    _linear(shapes, block + "attn.proj", WIDTH, WIDTH)
    if qk_norm:
      _norm(shapes, block + "attn.q_norm", WIDTH // HEADS)
      _norm(shapes, block + "attn.k_norm", WIDTH // HEADS)
    _linear(shapes, block + "mlp.fc1", MLP, WIDTH)
    _linear(shapes, block + "mlp.fc2", WIDTH, MLP)
    _norm(shapes, block + "norm1")
    _norm(shapes, block + "norm2")
    if init_values is not None:
      shapes[block + "ls1.gamma"] = shapes[block + "ls2.gamma"] = (WIDTH,)
  if fc_norm is None:  # timm's default: fc_norm for average pooling
    fc_norm = global_pool == "avg"
  _norm(shapes, "fc_norm" if fc_norm else "norm")
  if global_pool == "map":
    shapes["attn_pool.latent"] = (1, 1, WIDTH)
    _linear(shapes, "attn_pool.q", WIDTH, WIDTH)
    _linear(shapes, "attn_pool.kv", 2 * WIDTH, WIDTH)
    _linear(shapes, "attn_pool.proj", WIDTH, WIDTH)
    _norm(shapes, "attn_pool.norm")
    _linear(shapes, "attn_pool.mlp.fc1", MLP, WIDTH)
    _linear(shapes, "attn_pool.mlp.fc2", WIDTH, MLP)
  _linear(shapes, "head", CLASSES, WIDTH)
  return shapes


def random_head(seed=3):
  """A classification head for a headless source: logits of a few units."""
  rng = np.random.default_rng(seed)
  return {"kernel": (4 * rng.standard_normal((WIDTH, CLASSES)) /
                     np.sqrt(WIDTH)).astype(np.float32),
          "bias": (0.2 * rng.standard_normal(CLASSES)).astype(np.float32)}


def with_head(loaded):
  """(model, params) of a headless Checkpoint given random_head()."""
  assert "head" not in loaded.params
  inference = pretrained.inference_of(dataclasses.replace(
      loaded, params={**loaded.params, "head": random_head()}))
  assert inference.image_size == SIDE
  return inference.model, inference.params


def check_headless(source, tensors, forward, eps, gelu):
  """Loads a headless HF `source` built from `tensors`: it computes with
  `eps` and `gelu`, is refused for inference, and given random_head()
  matches the reference `forward`. Returns (its Checkpoint, model, params).
  """
  loaded = pretrained.load(source)
  assert (loaded.function["layer_norm_epsilon"], loaded.function["gelu"]) == (
      eps, gelu)
  assert_options_from_headers(source)
  with pytest.raises(errors.InputError, match="no classification head"):
    pretrained.for_inference(source)
  model, params = with_head(loaded)
  x = images()
  head = random_head()
  check_logits(logits_of((model, params), x), forward(
      tensors, x, HEADS, eps, gelu, head=(head["kernel"], head["bias"])))
  return loaded, model, params


def check_logits(ours, expected):
  assert np.abs(expected).max() > 1  # Logits that say something.
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


def siglip_tensors(siglip2, names, side=SIDE, seed=0):
  """(the tensors as the file holds them, its config) for names "hub"
  (the vision_model. prefix), "transformers 5.23" (none) or "two towers"
  (a SiglipModel's: the prefix, and a text tower)."""
  tensors = random_tensors(siglip_shapes(
      prefix="" if names == "transformers 5.23" else "vision_model.",
      siglip2=siglip2, side=side, text_tower=names == "two towers"),
      seed=seed)
  return tensors, siglip_config(siglip2, names == "two towers", side)


@pytest.mark.parametrize("family", ["siglip", "siglip2"])
@pytest.mark.parametrize("names", ["hub", "transformers 5.23", "two towers"])
def test_a_siglip_image_tower_computes_its_features(tmp_path, family, names):
  tensors, config = siglip_tensors(family == "siglip2", names)
  source = write_hf_dir(tmp_path / "hf", tensors, config)
  loaded, model, _ = check_headless(source, tensors,
                                    reference_vit.forward_siglip, 1e-6, "tanh")
  assert "cls" not in loaded.params and "MAPHead_0" in loaded.params
  config = model.config
  assert (config.classifier, config.num_registers, config.layer_scale,
          config.qk_norm, config.num_heads) == ("map", 0, None, False, HEADS)


def test_a_siglip2_tower_of_no_square_grid_is_refused(tmp_path):
  tensors = random_tensors(siglip_shapes(siglip2=True))
  tensors["vision_model.embeddings.position_embedding.weight"] = (
      tensors["vision_model.embeddings.position_embedding.weight"][:48])
  for two_tower in (False, True):
    config = siglip_config(siglip2=True, two_tower=two_tower, num_patches=48)
    source = write_hf_dir(tmp_path / f"hf{two_tower}", tensors, config)
    with pytest.raises(errors.InputError, match="no square grid"):
      pretrained.load(source)


@pytest.mark.parametrize("registers", [0, REGISTERS])
@pytest.mark.parametrize("names", ["hub", "5.23"])
def test_a_dinov2_computes_its_pooled_output(tmp_path, registers, names):
  tensors = random_tensors(dinov2_shapes(registers, names))
  source = write_hf_dir(tmp_path / "hf", tensors, dinov2_config(registers))
  _, model, params = check_headless(
      source, tensors, reference_vit.forward_dinov2, 1e-6, "exact")
  config = model.config
  assert (config.classifier, config.num_registers, config.qk_norm) == (
      "token", registers, False)
  assert config.layer_scale is not None
  block = "Transformer/encoderblock_1/"
  np.testing.assert_array_equal(
      flat(params)[block + "ls2"],
      tensors["encoder.layer.1.layer_scale2.lambda1"])


def dinov3_shapes(registers=REGISTERS, gated=False, names="hub"):
  """transformers' DINOv3ViTModel state dict: no position table, and no
  bias on the keys' projection (its config's key_bias=False); its blocks
  named as on the hub (what save_pretrained writes) or as transformers
  5.24's modules name them ("modules")."""
  shapes = {"embeddings.cls_token": (1, 1, WIDTH),
            "embeddings.mask_token": (1, 1, WIDTH),
            "embeddings.patch_embeddings.weight": (WIDTH, 3, PATCH, PATCH),
            "embeddings.patch_embeddings.bias": (WIDTH,)}
  if registers:
    shapes["embeddings.register_tokens"] = (1, registers, WIDTH)
  for i in range(LAYERS):
    block = f"{'model.' if names == 'modules' else ''}layer.{i}."
    for name in ("q", "v", "o"):
      _linear(shapes, f"{block}attention.{name}_proj", WIDTH, WIDTH)
    shapes[block + "attention.k_proj.weight"] = (WIDTH, WIDTH)
    if gated:
      _linear(shapes, block + "mlp.gate_proj", MLP, WIDTH)
    _linear(shapes, block + "mlp.up_proj", MLP, WIDTH)
    _linear(shapes, block + "mlp.down_proj", WIDTH, MLP)
    _norm(shapes, block + "norm1")
    _norm(shapes, block + "norm2")
    shapes[block + "layer_scale1.lambda1"] = (WIDTH,)
    shapes[block + "layer_scale2.lambda1"] = (WIDTH,)
  _norm(shapes, "norm")
  return shapes


def dinov3_config(registers=REGISTERS, **more):
  return {"model_type": "dinov3_vit", "hidden_size": WIDTH,
          "intermediate_size": MLP, "num_hidden_layers": LAYERS,
          "num_attention_heads": HEADS, "hidden_act": "gelu",
          "layer_norm_eps": 1e-5, "rope_theta": 100.0, "image_size": SIDE,
          "patch_size": PATCH, "num_channels": 3, "query_bias": True,
          "key_bias": False, "value_bias": True, "proj_bias": True,
          "mlp_bias": True, "layerscale_value": 1.0, "use_gated_mlp": False,
          "num_register_tokens": registers, **more}


@pytest.mark.parametrize("registers,names", [(0, "hub"),
                                             (REGISTERS, "modules")])
def test_a_dinov3_computes_its_pooled_output_at_any_grid(tmp_path,
                                                         registers, names):
  tensors = random_tensors(dinov3_shapes(registers, names=names))
  source = write_hf_dir(tmp_path / "hf", tensors, dinov3_config(registers))
  loaded, model, params = check_headless(
      source, tensors, reference_vit.forward_dinov3, 1e-5, "exact")
  config = model.config
  assert (config.rope, config.rope_theta, config.posemb, config.classifier,
          config.num_registers, config.layer_scale, config.key_bias) == (
              "axial", 100.0, "none", "token", registers, 1.0, False)
  # key_bias=False: no key bias to train.
  assert not [key for key in flat(params) if key.endswith("/key/bias")]
  # With no table, any grid: a wide image, square and as NaFlex patches
  # (a grid of 8 x 12, padded to 100), gives the source's pooled output.
  inference = pretrained.for_inference(source, features=True)
  wide = np.random.default_rng(8).uniform(-1, 1, (1, SIDE, 24, 3))
  expected = reference_vit.forward_dinov3(tensors, wide, HEADS)
  _, features = models.logits_and_pre_logits(
      inference.model, inference.params, wide.astype(np.float32))
  np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-5)
  patches = wide[0].reshape(8, PATCH, 12, PATCH, 3).transpose(
      0, 2, 1, 3, 4).reshape(96, -1)
  batch = naflex.Patches(
      np.pad(patches, ((0, 4), (0, 0)))[None].astype(np.float32),
      np.array([[8, 12]], np.int32))
  _, features = models.logits_and_pre_logits(inference.model,
                                             inference.params, batch)
  np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-5)


def test_a_dinov3_and_a_rope_run_write_back_as_dinov3(tmp_path):
  """export --format=hf of a RoPE model with no table is a DINOv3ViTModel:
  a DINOv3 read and written is the same file's function and reads back
  bitwise; a RoPE run's backbone computes the same features, its head
  told to be left out."""
  tensors = random_tensors(dinov3_shapes(REGISTERS))
  source = write_hf_dir(tmp_path / "hf", tensors, dinov3_config(REGISTERS))
  loaded = pretrained.load(source)
  message = exports.write(loaded, "hf", str(tmp_path / "out"))
  assert "DINOv3ViTModel" in message and "left out" not in message
  back = pretrained.load(str(tmp_path / "out"))
  assert (back.function, back.image_size) == (loaded.function, SIDE)
  # Its input as its processor says it (ImageNet's, transformers'
  # default for the family), now in a preprocessor_config.json.
  assert "preprocessor_config" in back.normalization.said_by
  assert (back.normalization.mean, back.normalization.std) == (
      loaded.normalization.mean, loaded.normalization.std) == (
          files.IMAGENET.mean, files.IMAGENET.std)
  read, read_back = flat(loaded.params), flat(back.params)
  assert set(read_back) == set(read)
  for key, value in read.items():
    np.testing.assert_array_equal(read_back[key], value, err_msg=key)
  written = load_file(str(tmp_path / "out" / "model.safetensors"))
  x = images()
  np.testing.assert_allclose(
      reference_vit.forward_dinov3(written, x, HEADS),
      reference_vit.forward_dinov3(tensors, x, HEADS), rtol=1e-12)

  model = models.create(f"Ti/{PATCH}", CLASSES, hidden_size=WIDTH,
                        num_layers=LAYERS, mlp_dim=MLP, num_heads=HEADS,
                        posemb="none", rope="axial", rope_theta=20.0)
  params = randomize(flax.linen.meta.unbox(model.init(
      jax.random.key(0), x[:1], train=False)["params"]))
  run = pretrained.Checkpoint(params, "the run", {
      **models.FUNCTION_OPTIONS, "rope": "axial", "rope_theta": 20.0},
                              image_size=SIDE)
  message = exports.write(run, "hf", str(tmp_path / "run"))
  assert f"its head of {CLASSES} classes is left out" in message
  inference = pretrained.for_inference(str(tmp_path / "run"), features=True)
  assert inference.model.config.rope_theta == 20.0
  normalization = pretrained.load(str(tmp_path / "run")).normalization
  assert (normalization.mean, normalization.std) == (  # a run's [-1, 1]
      files.HALF.mean, files.HALF.std)
  np.testing.assert_allclose(
      models.logits_and_pre_logits(inference.model, inference.params, x)[1],
      models.logits_and_pre_logits(model, params, x)[1], rtol=1e-6,
      atol=1e-6)
  with pytest.raises(errors.InputError, match="DINOv3ViTModel"):
    exports.write(dataclasses.replace(run, params={
        **params, "Transformer": {**params["Transformer"], "posembed_input": {
            "pos_embedding": np.zeros((1, 64, WIDTH), np.float32)}}}), "hf",
                  str(tmp_path / "refused"))


def test_a_gated_dinov3_computes_its_pooled_output_and_writes_back(
    tmp_path):
  """The largest DINOv3s' SwiGLU MLP (use_gated_mlp, SiLU): mlp "swiglu",
  its gate kept beside the MLP's first Dense; written back gated, it reads
  back bitwise. A gated MLP of another activation is refused by name."""
  tensors = random_tensors(dinov3_shapes(gated=True))
  source = write_hf_dir(tmp_path / "gated", tensors, dinov3_config(
      use_gated_mlp=True, hidden_act="silu"))
  loaded, model, _ = check_headless(
      source, tensors, reference_vit.forward_dinov3, 1e-5, "exact")
  assert model.config.mlp == "swiglu"
  exports.write(loaded, "hf", str(tmp_path / "out"))
  written = json.loads((tmp_path / "out" / "config.json").read_text())
  assert (written["use_gated_mlp"], written["hidden_act"]) == (True, "silu")
  read, read_back = flat(loaded.params), flat(pretrained.load(
      str(tmp_path / "out")).params)
  assert set(read_back) == set(read)
  for key, value in read.items():
    np.testing.assert_array_equal(read_back[key], value, err_msg=key)
  source = write_hf_dir(tmp_path / "gelu", tensors, dinov3_config(
      use_gated_mlp=True))
  with pytest.raises(errors.InputError, match="gated MLP of hidden_act "
                     "'gelu'"):
    pretrained.load(source)


def eva_dinov3_shapes(qkv_bias=True, swiglu=False):
  """timm's DINOv3 port (its Eva class): no position table, the class
  token and four registers, one fused qkv Linear whose biases are q_bias
  and v_bias (vit_*_dinov3_qkvb) or none (vit_*_dinov3), layer scales
  gamma_1 and gamma_2, and (`swiglu`, the largest) a SwiGLU MLP."""
  shapes = {"cls_token": (1, 1, WIDTH), "reg_token": (1, REGISTERS, WIDTH),
            "patch_embed.proj.weight": (WIDTH, 3, PATCH, PATCH),
            "patch_embed.proj.bias": (WIDTH,)}
  for i in range(LAYERS):
    block = f"blocks.{i}."
    shapes[block + "gamma_1"] = shapes[block + "gamma_2"] = (WIDTH,)
    _norm(shapes, block + "norm1")
    _norm(shapes, block + "norm2")
    shapes[block + "attn.qkv.weight"] = (3 * WIDTH, WIDTH)
    if qkv_bias:
      shapes[block + "attn.q_bias"] = shapes[block + "attn.v_bias"] = (WIDTH,)
    _linear(shapes, block + "attn.proj", WIDTH, WIDTH)
    for name in ("mlp.fc1_g", "mlp.fc1_x") if swiglu else ("mlp.fc1",):
      _linear(shapes, block + name, MLP, WIDTH)
    _linear(shapes, block + "mlp.fc2", WIDTH, MLP)
  _norm(shapes, "norm")
  return shapes


def eva_dinov3_file(directory, qkv_bias=True, swiglu=False):
  tensors = random_tensors(eva_dinov3_shapes(qkv_bias, swiglu))
  path = str(directory / "dinov3.safetensors")
  save_file(tensors, path, metadata={"format": "pt"})
  return tensors, path


@pytest.mark.parametrize("qkv_bias,swiglu", [(True, False), (False, True)])
def test_a_timm_dinov3_computes_its_pooled_features_and_writes_back(
    tmp_path, qkv_bias, swiglu):
  """timm's DINOv3 ports average their patch tokens (its default
  global_pool "avg"): the class token is one more register. Any grid, as
  images and as NaFlex patches; written back, the very same file. The
  largest have a SwiGLU MLP."""
  tensors, path = eva_dinov3_file(tmp_path, qkv_bias, swiglu=swiglu)
  assert_options_from_headers(path)
  with pytest.raises(errors.InputError, match="--num_heads"):
    pretrained.load(path)  # A width of 32: DINOv3's heads are 64 wide.
  loaded = pretrained.load(path, HEADS)
  assert loaded.image_size == 256  # timm's input size for its DINOv3s.
  inference = pretrained.for_inference(path, HEADS, features=True)
  config = inference.model.config
  assert (config.rope, config.rope_theta, config.posemb, config.classifier,
          config.num_registers, config.layer_scale,
          config.layer_norm_epsilon, config.final_norm, config.mlp) == (
              "axial", 100.0, "none", "gap", REGISTERS + 1, 1.0, 1e-5,
              "tokens", "swiglu" if swiglu else "gelu")
  wide = np.random.default_rng(8).uniform(-1, 1, (2, SIDE, 24, 3))
  expected = reference_vit.forward_eva_dinov3(tensors, wide, HEADS)
  _, features = models.logits_and_pre_logits(
      inference.model, inference.params, wide.astype(np.float32))
  np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-5)
  patches = wide.reshape(2, 8, PATCH, 12, PATCH, 3).transpose(
      0, 1, 3, 2, 4, 5).reshape(2, 96, -1)
  batch = naflex.Patches(
      np.pad(patches, ((0, 0), (0, 4), (0, 0))).astype(np.float32),
      np.array([[8, 12]] * 2, np.int32))
  _, features = models.logits_and_pre_logits(inference.model,
                                             inference.params, batch)
  np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-5)

  out = str(tmp_path / "back.safetensors")
  how = exports.write(loaded, "timm", out)
  for argument in ("timm.models.eva.Eva(", "rope_type='dinov3'",
                   f"qkv_bias={qkv_bias}", "global_pool='avg'",
                   "class_token=True", f"num_reg_tokens={REGISTERS}",
                   f"num_heads={HEADS}", "img_size=256", "eps=1e-05"):
    assert argument in how
  assert ("swiglu_mlp=True" in how) == swiglu
  assert_same_tensors(load_file(out), tensors)


def test_a_rope_run_writes_a_timm_eva_without_a_key_bias(tmp_path):
  """A RoPE run with no table is written as timm's Eva, which has no key
  bias: refused while its key biases are not zero, then computing our
  features; its first register written as Eva's class token."""
  model = models.create(f"Ti/{PATCH}", CLASSES, hidden_size=WIDTH,
                        num_layers=LAYERS, mlp_dim=MLP, num_heads=HEADS,
                        posemb="none", rope="axial", classifier="gap",
                        num_registers=2, layer_scale=0.1, gelu="exact")
  x = images()
  params = randomize(flax.linen.meta.unbox(model.init(
      jax.random.key(0), x[:1], train=False)["params"]))
  run = pretrained.Checkpoint(params, "the run", {
      **models.FUNCTION_OPTIONS, "rope": "axial", "gelu": "exact"},
                              image_size=SIDE)
  with pytest.raises(errors.InputError, match="key bias"):
    exports.write(run, "timm", str(tmp_path / "refused.safetensors"))
  params = flax.traverse_util.unflatten_dict({
      key: np.zeros_like(value) if key.endswith("/key/bias") else value
      for key, value in flat(params).items()}, sep="/")
  out = str(tmp_path / "run.safetensors")
  how = exports.write(dataclasses.replace(run, params=params), "timm", out)
  assert "num_reg_tokens=1" in how and f"num_classes={CLASSES}" in how
  written = load_file(out)
  assert written["cls_token"].shape == (1, 1, WIDTH)
  _, ours = models.logits_and_pre_logits(model, params, x)
  np.testing.assert_allclose(
      reference_vit.forward_eva_dinov3(written, x, HEADS, eps=1e-6), ours,
      rtol=1e-5, atol=1e-5)


def eva_rope_shapes(kind, table=False):
  """timm's RoPE ViTs (its Eva class, attn_type "rope"): a class token,
  no registers, one fused qkv Linear with its bias, layer scales, a
  classifier; `table`, a position table of the patches alone
  (vit_*_rope_ape_*, no_embed_class); "mixed" (vit_*_rope_mixed_*) with
  its learned frequencies."""
  shapes = {"cls_token": (1, 1, WIDTH),
            "patch_embed.proj.weight": (WIDTH, 3, PATCH, PATCH),
            "patch_embed.proj.bias": (WIDTH,)}
  if table:
    shapes["pos_embed"] = (1, (SIDE // PATCH) ** 2, WIDTH)
  if kind == "mixed":
    shapes["rope.freqs"] = (2, LAYERS, HEADS, WIDTH // HEADS // 2)
  for i in range(LAYERS):
    block = f"blocks.{i}."
    shapes[block + "gamma_1"] = shapes[block + "gamma_2"] = (WIDTH,)
    _norm(shapes, block + "norm1")
    _norm(shapes, block + "norm2")
    _linear(shapes, block + "attn.qkv", 3 * WIDTH, WIDTH)
    _linear(shapes, block + "attn.proj", WIDTH, WIDTH)
    _linear(shapes, block + "mlp.fc1", MLP, WIDTH)
    _linear(shapes, block + "mlp.fc2", WIDTH, MLP)
  _norm(shapes, "norm")
  _linear(shapes, "head", CLASSES, WIDTH)
  return shapes


@pytest.mark.parametrize("kind,table", [("index", False), ("mixed", False),
                                        ("index", True)])
def test_a_timm_rope_vit_computes_its_logits_and_writes_back(tmp_path, kind,
                                                             table):
  """timm's RoPE ViTs turn interleaved channel pairs, the column's first
  (rope "index", timm's "cat"), or by learned frequencies ("mixed"): read
  with their query and key channels permuted to vit_jax's pairs, they
  compute timm's logits (the float64 reference, in timm's own terms), at
  any grid without a table; written back, the very same file."""
  tensors = random_tensors(eva_rope_shapes(kind, table))
  if kind == "mixed":  # Frequencies of about a turn per patch or less.
    tensors["rope.freqs"] = (tensors["rope.freqs"] * 5).astype(np.float32)
  path = str(tmp_path / "rope.safetensors")
  save_file(tensors, path, metadata={"format": "pt"})
  assert_options_from_headers(path)
  inference = pretrained.for_inference(path, HEADS)
  config = inference.model.config
  assert (config.rope, config.posemb, config.classifier,
          config.num_registers, config.layer_scale) == (
              kind, "learn" if table else "none", "token", 0, 1.0)
  assert inference.image_size == SIDE if table else 224
  x = images()
  theta = 100.0 if kind == "index" else 10.0
  check_logits(logits_of(inference, x), reference_vit.forward_eva_rope(
      tensors, x, HEADS, theta=theta))
  if not table:
    wide = np.random.default_rng(8).uniform(-1, 1, (2, SIDE, 24, 3))
    check_logits(logits_of(inference, wide.astype(np.float32)),
                 reference_vit.forward_eva_rope(tensors, wide, HEADS,
                                                theta=theta))
  out = str(tmp_path / "back.safetensors")
  how = exports.write(pretrained.load(path, HEADS), "timm", out)
  for argument in ("timm.models.eva.Eva(", "attn_type='rope'",
                   f"rope_type='{'cat' if kind == 'index' else 'mixed'}'",
                   "rope_grid_indexing='xy'", "global_pool='token'"):
    assert argument in how
  assert ("no_embed_class=True" in how) == table
  assert_same_tensors(load_file(out), tensors)


def test_a_mixed_rope_model_learns_its_frequencies():
  """rope "mixed": each block's frequencies are params (stacked when the
  layers are scanned) that the loss reaches."""
  for scan in (False, True):
    model = models.create(f"Ti/{PATCH}", CLASSES, hidden_size=WIDTH,
                          num_layers=LAYERS, mlp_dim=MLP, num_heads=HEADS,
                          rope="mixed", posemb="none", scan_layers=scan)
    x = images()
    params = randomize(flax.linen.meta.unbox(model.init(
        jax.random.key(0), x[:1], train=False)["params"]))
    key = [k for k in flat(params) if k.endswith("rope_freqs")]
    assert len(key) == (1 if scan else LAYERS)
    grads = jax.grad(lambda p: model.apply(
        {"params": p}, x, train=False).sum())(params)
    assert np.abs(flat(grads)[key[0]]).max() > 0


@pytest.mark.parametrize("shapes,why", [
    ({**eva_dinov3_shapes(), "pos_embed": (1, 64, WIDTH)},
     "registers and a position table"),
    ({**eva_rope_shapes("index"), "blocks.0.mlp.fc1_g.weight": (MLP, WIDTH)},
     "EVA-02"),
])
def test_timm_evas_we_cannot_compute_are_refused_by_name(tmp_path, shapes,
                                                         why):
  path = str(tmp_path / "eva.safetensors")
  save_file(random_tensors(shapes), path, metadata={"format": "pt"})
  for read in (pretrained.load, pretrained.source_options):
    with pytest.raises(errors.InputError, match=why):
      read(path)


def test_dinov2_g_reads_alike_in_the_hubs_names_and_transformers_5s(
    tmp_path):
  """DINOv2-g's SwiGLU MLP: the hub's fused `weights_in` (the gate's rows
  first; against transformers itself: test_recorded_libraries.py's
  hf_dinov2_swiglu) and transformers 5's gate_proj / up_proj /
  down_proj give the same params."""
  hub = random_tensors(dinov2_shapes(swiglu=True))
  five = {}
  for name, value in hub.items():
    if ".mlp.weights_in." in name:
      gate, up = np.split(value, 2)
      five[name.replace("weights_in", "gate_proj")] = gate
      five[name.replace("weights_in", "up_proj")] = up
    else:
      five[name.replace("weights_out", "down_proj")] = value
  config = dinov2_config(use_swiglu_ffn=True)
  loaded = [pretrained.load(write_hf_dir(tmp_path / name, tensors, config))
            for name, tensors in (("hub", hub), ("five", five))]
  assert pretrained.source_options(str(tmp_path / "hub"))["mlp"] == "swiglu"
  flat = [flax.traverse_util.flatten_dict(one.params, sep="/")
          for one in loaded]
  assert flat[0].keys() == flat[1].keys()
  for key, value in flat[0].items():
    np.testing.assert_array_equal(flat[1][key], value, err_msg=key)
  gate = "Transformer/encoderblock_0/MlpBlock_3/Dense_gate/kernel"
  np.testing.assert_array_equal(
      flat[0][gate], hub["encoder.layer.0.mlp.weights_in.weight"][:MLP].T)


def test_a_dinov2_classifier_is_refused_by_name(tmp_path):
  # Its classifier reads the class token and the patch tokens' mean.
  tensors = {"dinov2." + key: value for key, value in
             random_tensors(dinov2_shapes()).items()}
  tensors.update(random_tensors({"classifier.weight": (CLASSES, 2 * WIDTH),
                                 "classifier.bias": (CLASSES,)}))
  source = write_hf_dir(tmp_path / "classifier", tensors, dinov2_config(
      architectures=["Dinov2ForImageClassification"],
      id2label={str(i): f"class {i}" for i in range(CLASSES)}))
  with pytest.raises(errors.InputError,
                     match="Dinov2ForImageClassification"):
    pretrained.load(source)


# timm VisionTransformer arguments -> (our classifier, registers): a class
# token that the model does not pool (average or attention pooling read the
# patch tokens only) is one more register.
TIMM_CASES = {
    "map, registers, layer scale": (
        dict(reg_tokens=REGISTERS, init_values=1e-5, global_pool="map"),
        ("map", REGISTERS + 1)),
    "qk_norm": (dict(qk_norm=True), ("token", 0)),
    "no_embed_class, registers, token": (
        dict(no_embed_class=True, reg_tokens=REGISTERS, global_pool="token"),
        ("token", REGISTERS)),
    "registers, no class token, avg": (
        dict(class_token=False, reg_tokens=REGISTERS, global_pool="avg"),
        ("gap", REGISTERS)),
    "class token, avg": (dict(class_token=True, global_pool="avg"),
                         ("gap", 1)),
}


def timm_file(directory, options, side=SIDE, seed=0):
  tensors = random_tensors(timm_today_shapes(**options, side=side), seed=seed)
  path = str(directory / "timm.safetensors")
  save_file(tensors, path, metadata={"format": "pt"})
  return tensors, path


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_a_timm_file_with_todays_options_computes_its_logits_and_exports(
    tmp_path, case):
  options, (classifier, registers) = TIMM_CASES[case]
  tensors, path = timm_file(tmp_path, options)
  assert_options_from_headers(path)
  inference = pretrained.for_inference(path, num_heads=HEADS)
  config = inference.model.config
  assert (config.classifier, config.num_registers, config.qk_norm,
          config.layer_scale is not None, config.final_norm) == (
              classifier, registers, bool(options.get("qk_norm")),
              "init_values" in options,
              "pooled" if options.get("global_pool") == "avg" else "tokens")
  assert (config.layer_norm_epsilon, config.gelu) == (1e-6, "exact")

  x = images()
  expected = reference_vit.forward_timm(
      tensors, x, HEADS, 1e-6, "exact",
      global_pool=options.get("global_pool", "token"))
  ours = logits_of(inference, x)
  check_logits(ours, expected)

  # Written back for timm (registers and an unpooled class token as
  # reg_token, their position embedding folded in): timm's forward of the
  # written file and ours of it read back compute the same.
  out = str(tmp_path / "out.safetensors")
  how = exports.write(pretrained.load(path, HEADS), "timm", out)
  assert "load_state_dict" in how and f"num_heads={HEADS}" in how
  written = load_file(out)
  np.testing.assert_allclose(
      reference_vit.forward_timm(written, x, HEADS, 1e-6, "exact"),
      expected, rtol=1e-5, atol=1e-5)
  again = pretrained.for_inference(out, num_heads=HEADS)
  assert (again.model.config.classifier, again.model.config.num_registers) == (
      classifier, registers)
  np.testing.assert_allclose(logits_of(again, x), ours, rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("family,parts", [
    ("siglip", ("attention pooling",)),
    ("dinov2 with registers", ("register tokens", "layer scale")),
])
def test_todays_hf_sources_are_refused_by_name_on_hf_export(tmp_path, family,
                                                            parts):
  if family == "siglip":
    source = write_hf_dir(tmp_path / "hf", *siglip_tensors(False, "hub"))
  else:
    source = write_hf_dir(tmp_path / "hf", random_tensors(
        dinov2_shapes(REGISTERS)), dinov2_config(REGISTERS))
  loaded = pretrained.load(source)
  loaded = dataclasses.replace(loaded, params={**loaded.params,
                                               "head": random_head()})
  with pytest.raises(errors.InputError) as error:
    exports.write(loaded, "hf", str(tmp_path / "out"))
  for part in parts:
    assert part in str(error.value)


def digits_sources(tmp_path):
  """{name: (init_from, num_heads)} of sources shaped like the digits
  test model (tests/util.py's SMALL, at 8x8 with patch 2)."""
  hf_siglip = write_hf_dir(tmp_path / "siglip", *siglip_tensors(
      False, "hub", side=DIGITS_SIDE, seed=1))
  hf_dinov2 = write_hf_dir(
      tmp_path / "dinov2", random_tensors(dinov2_shapes(
          REGISTERS, side=DIGITS_SIDE), seed=2),
      dinov2_config(REGISTERS, side=DIGITS_SIDE))
  _, timm = timm_file(tmp_path, TIMM_CASES["map, registers, layer scale"][0],
                      side=DIGITS_SIDE, seed=3)
  hf_siglip2 = write_hf_dir(tmp_path / "siglip2", *siglip_tensors(
      True, "hub", side=DIGITS_SIDE, seed=4))
  # big_vision's two-tower .npz, its image tower under params/img/.
  npz = str(tmp_path / "siglip.npz")
  np.savez(npz, **as_siglip_tower(flat(pretrained.load(hf_siglip).params)),
           **{"params/t": np.ones(1, np.float32)})
  hf_dinov3 = write_hf_dir(
      tmp_path / "dinov3", random_tensors(dinov3_shapes(REGISTERS), seed=5),
      dinov3_config(REGISTERS, image_size=DIGITS_SIDE))
  timm_dinov3 = str(tmp_path / "timm_dinov3.safetensors")
  save_file(random_tensors(eva_dinov3_shapes(swiglu=True), seed=6),
            timm_dinov3, metadata={"format": "pt"})
  timm_rope = str(tmp_path / "timm_rope.safetensors")
  save_file(random_tensors(eva_rope_shapes("mixed"), seed=7), timm_rope,
            metadata={"format": "pt"})
  return {"siglip": hf_siglip, "siglip .npz": npz, "siglip2": hf_siglip2,
          "dinov2 with registers": hf_dinov2,
          "dinov3 with registers": hf_dinov3,
          "timm map, registers, layer scale": timm,
          "timm dinov3, swiglu": timm_dinov3, "timm rope mixed": timm_rope}


@pytest.mark.parametrize("source", ["siglip", "siglip .npz", "siglip2",
                                    "dinov2 with registers",
                                    "dinov3 with registers",
                                    "timm map, registers, layer scale",
                                    "timm dinov3, swiglu",
                                    "timm rope mixed"])
def test_todays_sources_fine_tune_on_digits_with_no_other_flag(
    digits_data_dir, tmp_path, source):
  """init_from alone: the run takes the source's architecture and function,
  starts from all of it but the head, and learns."""
  path = digits_sources(tmp_path)[source]
  # From random weights the loss falls slowly at first: 30 steps take it
  # from ln 10 to about 2.0-2.2 (as they do a run from scratch), too near
  # the bar; 100 leave it at 1.0-1.4 for a few seconds more.
  config = small_config(
      digits_data_dir, init_from=path, total_steps=STEPS, log_every=1,
      checkpoint_every=STEPS, **{"model.dropout_rate": 0.0,
                                 "evaluators.test.every": 0})
  resolved = pretrained.with_source(settings.of(config))
  function = pretrained.load(path, HEADS).function
  loaded = flat(pretrained.load(path, HEADS).params)
  architecture = {**models.architecture_of(loaded), **function,
                  "posemb": models.posemb_of(loaded, function)}
  assert {key: getattr(resolved.model, key)
          for key in architecture} == architecture
  state, _ = start_of(resolved)
  started = flat(state.params)
  assert set(started) == set(loaded) | {"head/kernel", "head/bias"}
  for key, value in started.items():
    if not key.startswith("head/"):
      np.testing.assert_array_equal(value, loaded[key], err_msg=key)
  if source == "siglip .npz":
    # The "siglip" tower in big_vision's file: the same start (above) and
    # the same run as "siglip"'s, which trains below.
    return

  workdir = str(tmp_path / "run")
  run_training(config, workdir)
  losses = [row["train_loss"] for row in metric_rows(workdir)
            if "train_loss" in row]
  assert len(losses) == STEPS
  assert np.mean(losses[-5:]) < losses[0] - 0.2
  if "dinov3" in source:
    assert_writes_back_as_dinov3(workdir, tmp_path)


def assert_writes_back_as_dinov3(workdir, tmp_path):
  """A fine-tuned DINOv3 has trained no key bias: its source has none, and
  with RoPE one would change what its queries attend to. So it writes
  back to timm's Eva (logits) and to transformers' DINOv3ViTModel
  (features: the family has no head), each computing what `predict`
  computes."""
  run = pretrained.load(workdir)
  assert not [key for key in flat(run.params) if key.endswith("/key/bias")]
  inference = pretrained.for_inference(workdir, features=True)
  x = np.random.default_rng(3).uniform(
      -1, 1, (2, DIGITS_SIDE, DIGITS_SIDE, 3)).astype(np.float32)
  logits, features = models.logits_and_pre_logits(
      inference.model, inference.params, x)
  eps = inference.model.config.layer_norm_epsilon
  exports.write(run, "timm", str(tmp_path / "back.safetensors"))
  written = load_file(str(tmp_path / "back.safetensors"))
  head = (written["head.weight"].T, written["head.bias"])
  # timm's DINOv3 ports pool the patch tokens, an HF DINOv3 its class token.
  pool = "patches" if inference.model.config.classifier == "gap" else "class"
  np.testing.assert_allclose(
      reference_vit.forward_eva_dinov3(written, x, HEADS, eps, head=head,
                                       pool=pool), logits, rtol=1e-5,
      atol=1e-5)
  exports.write(run, "hf", str(tmp_path / "back_hf"))
  written = load_file(str(tmp_path / "back_hf" / "model.safetensors"))
  np.testing.assert_allclose(
      reference_vit.forward_dinov3(written, x, HEADS, eps, pool=pool),
      features, rtol=1e-5, atol=1e-5)


def test_a_config_that_sets_the_classifier_against_its_source_is_refused(
    digits_data_dir, tmp_path):
  source = write_hf_dir(tmp_path / "siglip", *siglip_tensors(
      False, "hub", side=DIGITS_SIDE))
  config = small_config(digits_data_dir, init_from=source,
                        **{"model.classifier": "token"})
  with pytest.raises(errors.ConfigError, match="classifier"):
    pretrained.with_source(settings.of(config))


def test_a_siglip2_tower_is_written_back_as_transformers_lays_it_out(
    tmp_path):
  """export --format=hf of a SigLIP-style tower writes a Siglip2VisionModel
  (which transformers computes at any NaFlex grid): the hub's tensors, in
  its names, read back to the same params."""
  tensors, config = siglip_tensors(siglip2=True, names="hub")
  source = write_hf_dir(tmp_path / "hub", tensors, config)
  loaded = pretrained.load(source)
  out = str(tmp_path / "exported")
  assert "Siglip2VisionModel" in exports.write(loaded, "hf", out)
  written = load_file(f"{out}/model.safetensors")
  assert sorted(written) == sorted(
      k for k in tensors if k.startswith("vision_model."))
  for key, value in written.items():
    np.testing.assert_array_equal(value, np.float32(tensors[key]))
  with open(f"{out}/config.json") as f:
    assert json.load(f)["model_type"] == "siglip2_vision_model"
  again = pretrained.load(out)
  assert flat(again.params).keys() == flat(loaded.params).keys()
  for key, value in flat(again.params).items():
    np.testing.assert_array_equal(value, flat(loaded.params)[key])
  with pytest.raises(errors.InputError, match="register tokens"):
    exports.write(dataclasses.replace(loaded, params={
        **loaded.params, "Transformer": {
            **loaded.params["Transformer"],
            "registers": np.zeros((1, 2, WIDTH), np.float32)}}), "hf",
                  str(tmp_path / "refused"))
