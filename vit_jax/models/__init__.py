"""Model zoo: `create("B/16", num_classes=1000, ...)` -> a flax.linen Module."""

import flax
import numpy as np

from vit_jax.models.vit import REMAT_POLICIES, VisionTransformer

# Where the release layout keeps the position embedding.
POSEMB_KEY = "Transformer/posembed_input/pos_embedding"

# Table 1 of the paper; Ti and S come from the later public release.
VARIANTS = {
    "Ti": dict(hidden_size=192, num_layers=12, mlp_dim=768, num_heads=3),
    "S": dict(hidden_size=384, num_layers=12, mlp_dim=1536, num_heads=6),
    "B": dict(hidden_size=768, num_layers=12, mlp_dim=3072, num_heads=12),
    "L": dict(hidden_size=1024, num_layers=24, mlp_dim=4096, num_heads=16),
    "H": dict(hidden_size=1280, num_layers=32, mlp_dim=5120, num_heads=16),
}
PATCH_SIZES = (8, 14, 16, 32)


def parse_name(name):
  """"B/16" -> ("B", 16); clear error for anything else."""
  variant, _, patch = name.partition("/")
  if variant not in VARIANTS or not patch.isdigit():
    raise ValueError(
        f"unknown model {name!r}: expected '<variant>/<patch>' with variant in "
        f"{sorted(VARIANTS)} and patch in {PATCH_SIZES}, e.g. 'B/16'")
  return variant, int(patch)


def create(name, num_classes, **overrides):
  """The ViT called `name` ("B/16", "H/14", ...) with a `num_classes` head.

  Overrides replace any VisionTransformer field: classifier, representation_size,
  dropout_rate, attention_dropout_rate, dtype, param_dtype, remat_policy,
  scan_layers, and also the size fields (hidden_size, num_layers, ...) for
  small models such as the digits one.
  Patch sizes outside PATCH_SIZES are accepted for small images (e.g. 2 on 8x8).
  """
  variant, patch = parse_name(name)
  fields = dict(VARIANTS[variant], patch_size=patch)
  unknown = set(overrides) - set(VisionTransformer.__dataclass_fields__)
  if unknown:
    raise ValueError(f"unknown model override(s) {sorted(unknown)} for {name!r}")
  fields.update(overrides)
  if fields.get("remat_policy", "") not in REMAT_POLICIES:
    raise ValueError(f"unknown remat_policy {fields['remat_policy']!r}; one "
                     f"of {sorted(REMAT_POLICIES)} ('' rematerialises nothing)")
  return VisionTransformer(num_classes=num_classes, **fields)


_BLOCK_0 = "Transformer/encoderblock_0/"


def grid_side(num_patches, what="the patches"):
  """g for a square g x g grid of `num_patches`; a ValueError naming `what`
  holds them otherwise."""
  side = int(round(np.sqrt(num_patches)))
  if side * side != num_patches:
    raise ValueError(f"{what}: {num_patches} patch positions do not form a "
                     "square grid")
  return side


def from_params(params):
  """(the VisionTransformer that `params` belong to, the image side its
  position embedding was trained at), with every size read from the shapes.

  `params` is a tree in the release layout (`checkpoint.load_npz`'s), any
  dtype; the model computes in float32. This is how a released file is run
  with no config: the class token says "token" (else "gap"), `pre_logits`
  gives representation_size and the query kernel (D, heads, D/heads) the
  head count.
  """
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
  wanted = ("embedding/kernel", "head/kernel", POSEMB_KEY,
            _BLOCK_0 + "MultiHeadDotProductAttention_1/query/kernel",
            _BLOCK_0 + "MlpBlock_3/Dense_0/kernel")
  missing = [key for key in wanted if key not in flat]
  if missing:
    raise ValueError(f"params lack {missing}: not a ViT in the release layout")
  patch, _, _, hidden = np.shape(flat["embedding/kernel"])
  num_layers = len({key.split("/")[1] for key in flat
                    if key.startswith("Transformer/encoderblock_")})
  classifier = "token" if "cls" in flat else "gap"
  grid = grid_side(np.shape(flat[POSEMB_KEY])[1] - (classifier == "token"),
                   POSEMB_KEY)
  model = VisionTransformer(
      num_classes=np.shape(flat["head/kernel"])[1], patch_size=patch,
      hidden_size=hidden, num_layers=num_layers,
      num_heads=np.shape(flat[wanted[3]])[1],
      mlp_dim=np.shape(flat[wanted[4]])[1], classifier=classifier,
      representation_size=(np.shape(flat["pre_logits/kernel"])[1]
                           if "pre_logits/kernel" in flat else None))
  return model, grid * patch
