"""Model zoo: `create("B/16", num_classes=1000, ...)` -> a flax.linen Module."""

import collections
import dataclasses
import re

import flax
import numpy as np

from vit_jax import errors
from vit_jax.models import (
  config as config_lib,
  mae as mae_lib,
  options,
  text as text_lib,
  two_towers,
)
from vit_jax.models.config import (
  CONFIG_FIELDS,
  POSEMB_2D_KEYS as POSEMB_2D_KEYS,  # Also read by weights/.
  POSEMB_KEY as POSEMB_KEY,
  ViTConfig,
)
from vit_jax.models.heads import (
  logits_and_pre_logits as logits_and_pre_logits,  # For the model's users.
)
from vit_jax.models.mae import MaskedAutoencoder as MaskedAutoencoder
from vit_jax.models.positions import (
  grid_side as grid_side,  # Also read by weights/.
)
from vit_jax.models.vit import MaskedPatchViT, VisionTransformer

# Table 1 of the paper; Ti and S come from the later public release.
VARIANTS = {
    "Ti": dict(hidden_size=192, num_layers=12, mlp_dim=768, num_heads=3),
    "S": dict(hidden_size=384, num_layers=12, mlp_dim=1536, num_heads=6),
    "B": dict(hidden_size=768, num_layers=12, mlp_dim=3072, num_heads=12),
    "L": dict(hidden_size=1024, num_layers=24, mlp_dim=4096, num_heads=16),
    "H": dict(hidden_size=1280, num_layers=32, mlp_dim=5120, num_heads=16),
}
PATCH_SIZES = (8, 14, 16, 32)

# The fields that set what a model computes beyond its sizes, and the
# release's values of them (config.py declares which: kind FUNCTION). They
# travel with a model's params: a run started from another source's weights
# computes that source's function (pretrained.with_source).
FUNCTION_OPTIONS = config_lib.declared(options.FUNCTION)
# The parts of the architecture that a checkpoint fixes beyond its sizes,
# and their defaults (the paper's ViT): kind ARCHITECTURE. A fine-tune takes
# them from its source too, read from the params (`architecture_of`,
# `posemb_of`).
ARCHITECTURE_OPTIONS = config_lib.declared(options.ARCHITECTURE)
# The classification heads of release-layout params: a distillation
# token's has its own (heads.py). A fine-tune to other classes starts both
# afresh.
HEADS = ("head", "head_dist")
# Options a config may leave unset (None): a run resolves them from its
# source (weights/pretrained.py), and a model made without one computes the
# default.
SOURCE_OPTIONS = {**FUNCTION_OPTIONS, **ARCHITECTURE_OPTIONS}

# The hybrids' BiT ResNet stems (units per stage), by ResNet and by the
# pixels per token they give with patch size 1 on their feature map.
# Three stages shrink the image 16 times (R50's fourth stage dropped and
# its units added to the third), four stages 32 times.
HYBRID_STAGES = {
    ("R50", 16): (3, 4, 9),
    ("R50", 32): (3, 4, 6, 3),
    ("R26", 32): (2, 2, 2, 2),
}


def parse_name(name):
  """"B/16" -> ("B", 16); "R50+B/16" -> ("B", 16) too. Clear error for
  anything else."""
  variant, _, patch = name.rpartition("+")[2].partition("/")
  if variant not in VARIANTS or not patch.isdigit():
    raise errors.InputError(
        f"unknown model {name!r}: expected '<variant>/<patch>' with variant in "
        f"{sorted(VARIANTS)} and patch in {PATCH_SIZES}, e.g. 'B/16', or a "
        f"hybrid '<resnet>+<variant>/<pixels per token>', one of "
        f"{hybrid_names()}")
  return variant, int(patch)


def hybrid_names():
  return [f"{resnet}+<variant>/{stride}" for resnet, stride in HYBRID_STAGES]


def create(name, num_classes, **overrides):
  """The ViT called `name` ("B/16", "H/14", ...) with a `num_classes` head.

  Overrides replace any ViTConfig field: classifier, representation_size,
  dropout_rate, attention_dropout_rate, dtype, param_dtype, posemb,
  remat_policy, scan_layers, resnet_stages, resnet_width, and also the size
  fields (hidden_size, num_layers, ...) for small models such as the digits
  one. Patch sizes outside PATCH_SIZES are accepted for small images (e.g. 2
  on 8x8). `mpp=True` gives the masked-patch-prediction model,
  MaskedPatchViT, instead of the classifier. An override of None leaves
  its field as the name (or ViTConfig's default) sets it.

  A hybrid ("R50+B/16", "R50+L/32", "R26+S/32") puts the BiT ResNet stem of
  HYBRID_STAGES under the ViT, with patch size 1 on its feature map; the
  number after the slash is the pixels per token that makes.
  """
  variant, patch = parse_name(name)
  fields = dict(VARIANTS[variant], patch_size=patch)
  if "+" in name:
    key = (name.partition("+")[0], patch)
    if key not in HYBRID_STAGES:
      raise errors.InputError(f"unknown hybrid {name!r}: the hybrids are "
                              f"{hybrid_names()}")
    fields.update(patch_size=1, resnet_stages=HYBRID_STAGES[key])
  # `mpp` picks the head: masked patch prediction instead of classes.
  model_class = MaskedPatchViT if overrides.pop("mpp", False) else (
      VisionTransformer)
  overrides = {key: value for key, value in overrides.items()
               if value is not None}
  unknown = set(overrides) - CONFIG_FIELDS
  if unknown:
    raise errors.InputError(
        f"unknown model override(s) {sorted(unknown)} for {name!r}")
  fields.update(overrides)
  if fields.get("resnet_stages") is not None:  # A list, from a JSON config.
    fields["resnet_stages"] = tuple(fields["resnet_stages"])
  model = model_class(num_classes=num_classes, config=ViTConfig(**fields))
  model.check_options()  # Here, once, rather than when it is traced.
  return model


def create_from_settings(model, num_classes):
  """The model that typed model settings (runs/settings.py's Model: its
  name and an override of each field) describe.

  A remat_policy or attention of "auto" is a run's to make concrete (it
  depends on the devices: training/fitting.py); a model built from settings
  that no run resolved keeps every activation and computes attention with
  the einsum, which compute the same."""
  fields = dataclasses.asdict(model)
  if fields["remat_policy"] == "auto":
    fields["remat_policy"] = ""
  if fields["attention"] == "auto":
    fields["attention"] = "einsum"
  return create(fields.pop("name"), num_classes, **fields)


def masked_autoencoder_from_settings(model, mae):
  """The MaskedAutoencoder (models/mae.py) of typed model settings (the
  encoder's; its classifier head unused) and config.mae's (the mask ratio,
  the decoder's sizes)."""
  encoder = create_from_settings(model, 1).config
  sizes = mae_lib.DecoderSizes.of(mae)
  autoencoder = MaskedAutoencoder(
      encoder, mae_lib.decoder_config(encoder, sizes), mae.mask_ratio)
  autoencoder.check_options()
  return autoencoder


def two_towers_from_settings(model, image_text):
  """The TwoTowers (models/two_towers.py) of typed model settings (the
  image tower's; no classifier head) and config.image_text's (the text
  tower's sizes)."""
  image = create_from_settings(model, 0).config
  sizes = text_lib.TextSizes.of(image_text)
  towers = two_towers.TwoTowers(image, text_lib.text_config(image, sizes),
                                sizes.vocab_size)
  towers.check_options()
  return towers


def architecture_of(flat):
  """The ARCHITECTURE_OPTIONS of release-layout params (a flat '/'-keyed
  dict of arrays or shapes) but posemb (`posemb_of`), each read as
  config.py declares (its `marks`): e.g. a class token says classifier
  "token", `Transformer/registers` their count, `ls1` layer scale 1.0
  (whose initial value does not matter to loaded params)."""
  return config_lib.revealed(
      flat, [name for name in ARCHITECTURE_OPTIONS if name != "posemb"])


def posemb_prefix(flat):
  """The rows of release-layout params' learned position table ahead of
  the patches': the class token's and the distillation token's."""
  return int("cls" in flat) + int("dist" in flat)


def posemb_of(keys, function):
  """The posemb of release-layout params with these keys, computing
  `function` (FUNCTION_OPTIONS): the kind its table says; "none" for a
  rotary model with no table (DINOv3's); None where nothing says (no table:
  "sincos2d" or "none")."""
  posemb = config_lib.revealed(dict.fromkeys(keys), ["posemb"])["posemb"]
  if posemb is None and function.get("rope"):
    return "none"
  return posemb


def placeholder_head(params):
  """A linear head of no classes for headless release-layout `params`:
  `models.from_params` reads the model from them as it is (num_classes 0),
  and the features the head reads are computed as for any model, while
  its logits are empty."""
  pre_logits = params.get("pre_logits")
  width = (pre_logits["kernel"] if pre_logits else
           params["embedding"]["kernel"]).shape[-1]
  return {"kernel": np.zeros((width, 0), np.float32),
          "bias": np.zeros((0,), np.float32)}


def from_params(params, posemb=None, **function):
  """(the VisionTransformer that `params` belong to, the image side its
  position embedding was trained at, or None if no params tell), with every
  size read from the shapes.

  `params` is a tree in the release layout (`checkpoint.load_npz`'s), any
  dtype; the model computes in float32. This is how a released file is run
  with no config: `architecture_of` gives the classifier, layer scale,
  registers and query/key norms; `pre_logits`
  gives representation_size and the query kernel (D, heads, D/heads) the
  head count. A `conv_root` makes it a hybrid, whose stages are counted
  from the `block{i}/unit{j}` it holds. The position embedding's params give
  its kind; give `posemb` for the kinds without params ("sincos2d", "none").
  `fc_norm` says final_norm "pooled". Shapes cannot tell
  `layer_norm_epsilon` and `gelu`: `function` gives them where the source
  is not the release's (FUNCTION_OPTIONS).
  """
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
  wanted = ("embedding/kernel", "head/kernel",
            config_lib.BLOCK_0 + "MultiHeadDotProductAttention_1/query/kernel",
            config_lib.BLOCK_0 + "MlpBlock_3/Dense_0/kernel")
  missing = [key for key in wanted if key not in flat]
  if missing:
    raise errors.InputError(
        f"params lack {missing}: not a ViT in the release layout")
  if posemb is None:
    posemb = posemb_of(flat, function)
    if posemb is None:
      raise errors.InputError(
          f"params hold no position embedding ({POSEMB_KEY} or "
          f"{POSEMB_2D_KEYS[0]}): say which kind they were trained with, "
          "posemb='sincos2d' or 'none'")
  patch, _, _, hidden = np.shape(flat["embedding/kernel"])
  num_layers = len({key.split("/")[1] for key in flat
                    if key.startswith("Transformer/encoderblock_")})
  hybrid = {}
  if "conv_root/kernel" in flat:
    units = collections.Counter(
        key.split("/")[0] for key in flat
        if re.fullmatch(r"block\d+/unit\d+/conv1/kernel", key))
    hybrid = dict(resnet_stages=tuple(units[f"block{i + 1}"]
                                      for i in range(len(units))),
                  resnet_width=np.shape(flat["conv_root/kernel"])[-1])
  architecture = architecture_of(flat)
  grid = None
  if posemb == "learn":
    grid = grid_side(np.shape(flat[POSEMB_KEY])[1] - posemb_prefix(flat),
                     POSEMB_KEY)
  elif posemb == "learn2d":
    grid = np.shape(flat[POSEMB_2D_KEYS[0]])[0]
  config = ViTConfig(
      patch_size=patch, hidden_size=hidden, num_layers=num_layers,
      num_heads=np.shape(flat[wanted[2]])[1],
      mlp_dim=np.shape(flat[wanted[3]])[1],
      representation_size=(np.shape(flat["pre_logits/kernel"])[1]
                           if "pre_logits/kernel" in flat else None),
      posemb=posemb, **hybrid, **architecture, **function,
      **config_lib.revealed(flat, ["final_norm"]))
  model = VisionTransformer(num_classes=np.shape(flat["head/kernel"])[1],
                            config=config)
  model.check_options()
  return model, None if grid is None else grid * model.token_stride
