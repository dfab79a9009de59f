"""big_vision's two-tower .npz (its SigLIP checkpoints' layout), read whole
into models/two_towers.py's TwoTowers and written back.

The file holds `params/img/...` (big_vision's ViT: modules numbered per
type, the position table at the top; npz.py reads it as any big_vision
ViT), `params/txt/...` (its text transformer: `Embed_0`, `pos_embedding`,
`Encoder_0` of the ViT's blocks, `head`), `params/t` and `params/b`; the
"params/" prefix may be absent. Both towers compute big_vision's
function: flax's GELU (the tanh approximation) and LayerNorm epsilon
1e-6.
"""

import numpy as np

from vit_jax import errors, models, paths
from vit_jax.weights import npz, towers

PREFIX = "params/"
# big_vision's function (flax's GELU and LayerNorm defaults) is the
# release's.
FUNCTION = models.FUNCTION_OPTIONS
# The text tower's names in big_vision -> ours (models/text.py).
TEXT_NAMES = {"Embed_0/embedding": "token_embedding/embedding",
              "pos_embedding": models.POSEMB_KEY}
TEXT_ENCODER = "Encoder_0/"


def is_two_towers(path):
  """Whether `path` is an .npz of big_vision's two towers."""
  if not str(path).endswith(".npz"):
    return False
  return any(key.startswith(("txt/", PREFIX + "txt/"))
             for key in npz.array_names(path))


def read(path):
  """The two towers in the big_vision .npz at `path`: a
  towers.TwoTowersRead."""
  arrays = npz.read_arrays(path)
  if any(key.startswith(PREFIX) for key in arrays):
    arrays = {key[len(PREFIX):]: value for key, value in arrays.items()
              if key.startswith(PREFIX)}
  missing = [part for part in ("t", "b") if part not in arrays]
  if missing:
    raise errors.InputError(f"{path}: a two-tower file without {missing}: "
                            "vit_jax reads SigLIP's (sigmoid) two towers")
  image = npz.to_release_layout({key[4:]: value for key, value in
                                 arrays.items() if key.startswith("img/")})
  text = {}
  for key, value in arrays.items():
    if key.startswith("txt/"):
      key = key[4:]
      if key.startswith(TEXT_ENCODER):
        key = "Transformer/" + key[len(TEXT_ENCODER):]
      text[TEXT_NAMES.get(key, key)] = value
  text = {npz.release_key(key): value
          for key, value in npz.unscan_blocks(text).items()}
  return towers.assemble(image, FUNCTION, text, arrays["t"], arrays["b"])


def write(path, model, params):
  """A big_vision two-tower .npz (`read`'s layout, under "params/") of a
  TwoTowers `model` with `params`, big_vision's function."""
  function = {key: getattr(model.config, key) for key in FUNCTION}
  if function != FUNCTION:
    raise errors.InputError(
        "the two-tower model cannot be written as big_vision's .npz: it "
        f"computes {function}, big_vision's towers {FUNCTION}")
  image, text = towers.flat_towers(params)
  arrays = {}
  for key, value in image.items():
    arrays["img/" + ("pos_embedding" if key == models.POSEMB_KEY
                     else npz.big_vision_block_key(key))] = value
  names = {ours: theirs for theirs, ours in TEXT_NAMES.items()}
  for key, value in text.items():
    key = npz.big_vision_block_key(key)
    if key in names:
      key = names[key]
    elif key.startswith("Transformer/"):
      key = TEXT_ENCODER + key[len("Transformer/"):]
    arrays["txt/" + key] = value
  arrays.update(t=np.asarray(params["t"], np.float32).reshape(1),
                b=np.asarray(params["b"], np.float32).reshape(1))
  with paths.writing(path) as local, open(local, "wb") as f:
    np.savez(f, **{PREFIX + key: np.asarray(value)
                   for key, value in arrays.items()})
