"""The release's `.npz` checkpoints and the layouts we read.

Our params tree uses the module names of the released vit_jax files, so the
release layout is just the tree flattened with '/'. Two more layouts load:
big_vision's (modules numbered per type, position embedding at the top) and
big_vision's scanned one (one `encoderblock` whose arrays carry a leading
layer axis), each also under the `opt/target/` or `params/` prefix that
published files use, or `params/img/` (`img/`), the image tower of a SigLIP
or SigLIP 2 file (its attention-pooling `MAPHead_0` keeps big_vision's
names, which are ours), SigLIP 2 NaFlex's too (big_vision's naflex_vit: a
Dense patch embedding and a [G, G, D] position table, reshaped to ours);
bfloat16 arrays load as float32. Files are read without pickle.
"""

import contextlib
import math
import re
import zipfile

import flax
import flax.linen as nn
import jax
import ml_dtypes
import numpy as np
from etils import epath

from vit_jax import errors, models, paths

POSEMB_KEY = models.POSEMB_KEY


# big_vision numbers modules per type; the release counts across types.
_BIG_VISION_BLOCK_NAMES = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}
_RELEASE_BLOCK_NAMES = {ours: theirs for theirs, ours in
                        _BIG_VISION_BLOCK_NAMES.items()}
# A block's key: (the block's prefix, its module, the rest).
_BLOCK_MODULE = re.compile(r"(Transformer/encoderblock_\d+/)([^/]+)(/.*)")


def save_npz(params, path):
  """Writes `params` as a flat .npz in the released vit_jax layout.

  `params` may be what `model.init(...)["params"]` returns (arrays boxed in
  `nn.LogicallyPartitioned`, which are unboxed here), a FrozenDict or a plain
  dict, of numpy or jax arrays (sharded ones too, when fully addressable).
  A scanned model's stacked blocks are written one per layer. `path` may
  be a URL (`gs://...`); the file replaces an old one whole, and a write
  that fails (a full disk) leaves the old one as it was and names `path`.
  """
  params = flax.core.unfreeze(nn.meta.unbox(params))
  flat = unscan_blocks(flax.traverse_util.flatten_dict(params, sep="/"))
  arrays = {}
  for key, value in flat.items():
    array = np.asarray(value)
    if array.dtype.hasobject:
      raise errors.InputError(
          f"{key!r} is not an array of numbers "
          f"({type(value).__name__}); cannot save it without pickle")
    arrays[key] = array
  # A file object: np.savez adds ".npz" to a name without it, as the
  # temporary file's is. `local` is a local temporary file, not `path`.
  with paths.writing(path) as local, open(local, "wb") as f:
    np.savez(f, **arrays)


def load_npz(path):
  """Reads a released, big_vision or scanned big_vision .npz into our tree.

  Files are read with `np.load(allow_pickle=False)`, never with pickle. The
  tree may sit under a prefix, as in published files: `opt/target/` (some of
  the original release) or `params/` (big_vision); see `to_release_layout`,
  which drops whatever else such files hold (optimizer state, step counter).
  bfloat16 arrays (stored by numpy as 2-byte void, `|V2`) load as float32,
  exactly: every bfloat16 is a float32. Any other void, structured or object
  array is refused with an InputError naming its key.
  """
  return flax.traverse_util.unflatten_dict(
      to_release_layout(read_arrays(path)), sep="/")


def read_arrays(path):
  """{key: array} of the .npz at `path` as it stores them, checked and
  converted as `load_npz` says, in no layout but the file's own."""
  with _open_npz(path) as npz:
    return {key: _read_array(npz, key, path) for key in npz.files}


def array_names(path):
  """The names of the arrays in the .npz at `path`; none is read."""
  with _open_npz(path) as npz:
    return list(npz.files)


def read_shapes(path):
  """What `load_npz` would read, as shapes alone: {release-layout key:
  jax.ShapeDtypeStruct}, taken from each array's .npy header, so that no
  array is read (a few KB of an H/14's gigabytes on GCS). The dtypes are
  placeholders (float32): only the keys and shapes are the file's."""
  with _open_npz(path) as npz:
    flat = {}
    for key in npz.files:
      with npz.zip.open(key + ".npy") as member:
        version = np.lib.format.read_magic(member)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, _ = read_header(member)
      flat[key] = jax.ShapeDtypeStruct(shape, np.float32)
  return flax.traverse_util.unflatten_dict(to_release_layout(flat), sep="/")


@contextlib.contextmanager
def _open_npz(path):
  """The NpzFile at `path`, arrays read only when indexed; an InputError
  for anything else."""
  # epath: gs:// paths (the released files) read like local ones.
  with epath.Path(path).open("rb") as f:
    try:
      npz = np.load(f, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
      # numpy takes what is neither .npy nor .npz for a pickle.
      raise errors.InputError(f"{path} is not an .npz file of arrays (an "
                              "export of vit_jax, big_vision or timm)") from e
    if not isinstance(npz, np.lib.npyio.NpzFile):
      raise errors.InputError(f"{path} is a single .npy array, not an .npz "
                              "of named arrays")
    with npz:
      yield npz


def _read_array(npz, key, path):
  try:
    array = npz[key]
  except ValueError as e:
    if "allow_pickle" in str(e):
      raise errors.InputError(
          f"{path}: {key!r} holds pickled objects; only plain arrays are "
          "loaded, never pickle") from e
    raise
  dtype = array.dtype
  if dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
    return array.view(ml_dtypes.bfloat16).astype(np.float32)  # Exact.
  if dtype.kind in "VO":
    raise errors.InputError(
        f"{path}: {key!r} has dtype {dtype.str!r}, which is no "
        "array of numbers (only 2-byte void, numpy's bfloat16, "
        "is read)")
  return array


# Published files may store the tree under one of these; the rest of such a
# file (e.g. `opt/state/...`, `step`) is training state that is not loaded.
# SigLIP's two-tower files (big_vision) hold the image tower under "img/".
_PREFIXES = ("opt/target/", "params/", "params/img/", "img/")


# What the release and big_vision layouts have at the top of the tree.
_ROOT_LEAVES = ("cls", "dist", "pos_embedding")


_ROOT_MODULES = ("embedding/", "Transformer/", "fc_norm/", "pre_logits/",
                 "head/", "head_dist/", "MAPHead_0/")


def _is_param_key(key):
  return key in _ROOT_LEAVES or key.startswith(_ROOT_MODULES)


def _strip_prefix(flat):
  """The params under a published prefix, dropping the file's other entries."""
  found = [p for p in _PREFIXES
           if any(k.startswith(p) and _is_param_key(k[len(p):]) for k in flat)]
  if not found:
    return flat
  if len(found) > 1:
    raise errors.InputError(
        f"checkpoint has params under both {found[0]!r} and "
        f"{found[1]!r}; cannot tell which tree to load")
  (prefix,) = found
  if any(_is_param_key(k) for k in flat):
    raise errors.InputError(f"checkpoint has params both under {prefix!r} and "
                            "without a prefix; cannot tell which tree to load")
  return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}


def to_release_layout(flat):
  """Renames a flat {'a/b/c': array} dict of any known layout to the release's.

  A tree stored under `opt/target/` or `params/` is taken from there and every
  entry outside that prefix (optimizer state such as `opt/state/...`, a
  `step` counter, ...) is dropped. Then a scanned `Transformer/encoderblock/`
  is split into one block per layer, big_vision's per-type module names are
  renamed to the release's, and a NaFlex tower's patch embedding and
  position table are reshaped to ours (`_from_naflex`). A dict with no key
  that a known layout would have raises an InputError listing the keys it
  saw.
  """
  params = _strip_prefix(flat)
  if not any(_is_param_key(k) for k in params):
    keys = sorted(flat)
    raise errors.InputError(
        "not a ViT checkpoint of a known layout (released vit_jax or "
        "big_vision, optionally under 'opt/target/' or 'params/'); first keys: "
        f"{keys[:10]}{' ...' if len(keys) > 10 else ''}")
  flat = unscan_blocks(params)
  if any("/MlpBlock_0/" in k for k in flat):
    flat = {release_key(k): v for k, v in flat.items()}
  return _from_naflex(flat)


def _reshaped(value, shape):
  # read_shapes' leaves are ShapeDtypeStructs, which have no reshape.
  if isinstance(value, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(shape, value.dtype)
  return value.reshape(shape)


def _from_naflex(flat):
  """big_vision's NaFlex ViT (SigLIP 2 NaFlex's image tower) as our params.

  Its patch embedding is an nn.Dense on patches flattened as (row in patch,
  column in patch, channel), [p*p*3, D]: the same function as our nn.Conv of
  kernel [p, p, 3, D], whose kernel flattens in that order. Its position
  table is [G, G, D], row-major over (row, col): the same table as our
  "learn" [1, G*G, D] without a class token (SigLIP towers pool with the
  MAP head), which NaFlex batches resize per image as big_vision does. Its
  optional patch LayerNorms (patchln_pre on pixels, patchln_post on
  embeddings) have no counterpart in our model, so a file holding them is
  refused rather than run without them. Other layouts pass unchanged: only
  NaFlex's embedding kernel is 2-D.
  """
  patch_norms = sorted({k.split("/")[0] for k in flat
                        if k.startswith(("patchln_pre/", "patchln_post/"))})
  if patch_norms:
    raise errors.InputError(
        f"checkpoint has NaFlex patch LayerNorms {patch_norms}, which vit_jax "
        "does not compute; cannot load it")
  kernel = flat.get("embedding/kernel")
  if kernel is None or len(kernel.shape) != 2:
    return flat
  rows, width = kernel.shape
  patch = math.isqrt(rows // 3)
  if patch * patch * 3 != rows:
    raise errors.InputError(
        f"NaFlex 'embedding/kernel' has {rows} rows, not p*p*3 for a square "
        "patch of RGB pixels")
  out = dict(flat, **{"embedding/kernel": _reshaped(
      kernel, (patch, patch, 3, width))})
  if POSEMB_KEY in flat:
    shape = tuple(flat[POSEMB_KEY].shape)
    if len(shape) != 3 or shape[0] != shape[1]:
      raise errors.InputError(
          f"NaFlex 'pos_embedding' has shape {shape}, not a square table "
          "[G, G, D]")
    out[POSEMB_KEY] = _reshaped(flat[POSEMB_KEY], (1, shape[0] ** 2, shape[2]))
  return out


SCANNED_BLOCK = "Transformer/encoderblock/"


_BLOCK_KEY = re.compile(r"Transformer/encoderblock_(\d+)/(.*)")


def unscan_blocks(flat):
  """Splits the stacked `Transformer/encoderblock/...` arrays of a scanned
  model (leading axis: layer) into `encoderblock_{i}`; other keys pass.

  Leaves may be arrays or jax.ShapeDtypeStructs (a model's abstract params).
  """
  out = {}
  for key, value in flat.items():
    if not key.startswith(SCANNED_BLOCK):
      out[key] = value
      continue
    rest = key[len(SCANNED_BLOCK):]
    for i in range(value.shape[0]):
      out[f"Transformer/encoderblock_{i}/{rest}"] = (
          jax.ShapeDtypeStruct(value.shape[1:], value.dtype)
          if isinstance(value, jax.ShapeDtypeStruct) else value[i])
  return out


def scan_blocks(flat):
  """unscan_blocks' inverse: stacks `encoderblock_{i}` arrays, i = 0, 1, ..."""
  out, layers = {}, {}
  for key, value in flat.items():
    match = _BLOCK_KEY.fullmatch(key)
    if match:
      layers.setdefault(match.group(2), {})[int(match.group(1))] = value
    else:
      out[key] = value
  for rest, by_layer in layers.items():
    out[SCANNED_BLOCK + rest] = np.stack(
        [by_layer[i] for i in range(len(by_layer))])
  return out


def release_key(key):
  """A big_vision ViT's key in the release layout: its position table's,
  and its blocks' modules (numbered per type) renamed."""
  if key == "pos_embedding":
    return POSEMB_KEY
  return _renamed_block_module(key, _BIG_VISION_BLOCK_NAMES)


def big_vision_block_key(key):
  """A release-layout key with its block's module in big_vision's name
  (`release_key`'s renaming undone); any other key as it is."""
  return _renamed_block_module(key, _RELEASE_BLOCK_NAMES)


def _renamed_block_module(key, names):
  match = _BLOCK_MODULE.fullmatch(key)
  if match and match.group(2) in names:
    prefix, module, rest = match.groups()
    return prefix + names[module] + rest
  return key
