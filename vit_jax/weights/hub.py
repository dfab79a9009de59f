"""Models by their Hugging Face hub names: `hf://ORG/NAME[@REVISION]`.

A name is a repository on the hub (REVISION: a branch, a tag or a commit;
default main) that holds a transformers model (config.json with a
"model_type": an HF ViT, a SigLIP or SigLIP 2 model or tower, a DINOv2) or
a timm one (config.json with an "architecture", as timm's hub repositories
have). `find` resolves it through huggingface_hub's cache to what
vit_jax/weights/pytorch/ reads: the snapshot directory of a transformers
model, the `model.safetensors` of a timm one, and the commit it is.

The cache is read first, so that a name once fetched resolves offline and
to the same commit. A name not in it is fetched (config.json and the
safetensors weights only) unless the hub is off (HF_HUB_OFFLINE=1) or out
of reach, which is an error naming the `hf download` that fetches it. A
repository whose weights are PyTorch pickles only is refused: vit_jax
never unpickles.

A run records the commit its name resolved to (`Found.name`): its
config holds `hf://ORG/NAME@COMMIT`, and a resume that names the same
repository keeps it (`as_recorded`).
"""

import dataclasses
import json
import os
import re

import huggingface_hub
from huggingface_hub import constants as hub_constants, errors as hub_errors

from vit_jax import errors
from vit_jax.weights.pytorch import files as files_lib, hf

PREFIX = "hf://"
# The hub's rules for a repository id (each part starts and ends with a
# letter, digit or "_"; no "--" or ".."), and a git ref's for a revision.
_PART = r"\w(?:[\w.-]*\w)?"
_NAME = re.compile(rf"hf://({_PART}/{_PART})(?:@([\w.-]+(?:/[\w.-]+)*))?")
COMMIT = re.compile(r"[0-9a-f]{40}")
# What is fetched: a transformers model's weights (one file or shards and
# their index) and config.json; a timm repository's model.safetensors.
PATTERNS = ("config.json", "model*.safetensors*",
            hf.HF_PREPROCESSOR)
# Head counts of timm's ViT sizes whose width is none of the paper's
# (files_lib.heads_for_width knows those): timm's `vit_<size>_...`.
TIMM_HEADS = {"medium": 8, "mediumd": 8, "so400m": 16, "giant": 16,
              "gigantic": 16}


@dataclasses.dataclass(frozen=True)
class Found:
  """A source where it lies, with what to call it."""
  path: str  # the file or directory pytorch/ (or npz.py, ...) reads
  name: str  # the source as a run records it: a hub name with its commit
  what: str | None = None  # for messages; None: the path says it
  num_heads: int | None = None  # a timm config's, where it says
  # A timm config's input (its pretrained_cfg's mean and std), where it
  # says one.
  normalization: files_lib.Normalization | None = None


def is_name(source):
  return isinstance(source, str) and source.startswith(PREFIX)


def parse(name):
  """"hf://ORG/NAME[@REVISION]" -> ("ORG/NAME", REVISION or None)."""
  parsed = _parsed(name)
  if parsed is None:
    raise errors.InputError(
        f"{name!r} is no hub name: give hf://ORG/NAME or "
        "hf://ORG/NAME@REVISION (a branch, a tag or a commit)")
  return parsed


def _parsed(name):
  match = _NAME.fullmatch(name)
  if (not match or "--" in match.group(1) or ".." in name[len(PREFIX):]
      or len(match.group(1)) > 96):
    return None
  return match.group(1), match.group(2)


def find(name):
  """The Found of the hub name `name`: its snapshot in huggingface_hub's
  cache, fetched first where it is not there whole and the hub is on."""
  repo, revision = parse(name)
  folder = _cached(repo, revision)
  if folder is not None and not _whole(folder):
    _refuse_pickles(name, repo, _files(repo, folder))
    folder = None  # A part of it, as a download cut short leaves.
  if folder is None:
    folder = _fetch(repo, revision, name)
    if not _whole(folder):
      files = _files(repo, folder)
      _refuse_pickles(name, repo, files)
      raise errors.InputError(
          f"{name} holds no {hf.HF_CONFIG} and "
          f"{hf.HF_WEIGHTS} (its files: "
          f"{', '.join(sorted(files)[:8])}); vit_jax reads the hub's "
          "transformers and timm ViTs")
  commit = os.path.basename(folder)
  pinned = f"{PREFIX}{repo}@{commit}"
  what = f"{PREFIX}{repo}@{commit[:7]}"
  config = _config(folder, what)
  if "model_type" in config:
    return Found(folder, pinned, what)
  if "architecture" in config or repo.startswith("timm/"):
    return Found(os.path.join(folder, hf.HF_WEIGHTS), pinned, what,
                 _timm_heads(config), _timm_normalization(config, what))
  raise errors.InputError(
      f"{what}: its config.json names no transformers model_type and no "
      "timm architecture; vit_jax reads the hub's transformers and timm "
      "ViTs")


def as_recorded(given, recorded):
  """`given` (a resumed run's init_from) as the run `recorded` it: a hub
  name of the same repository that names no other commit is the recorded
  pin (a resume does not read init_from again, and without the hub a
  branch or tag cannot be told from the commit it pointed to then);
  anything else as given, for runs/store.py to judge."""
  names = _parsed(given), _parsed(recorded)
  if None in names:
    return given
  (repo, revision), (recorded_repo, commit) = names
  if repo == recorded_repo and (revision in (None, commit) or
                                not COMMIT.fullmatch(revision)):
    return recorded
  return given


def _cached(repo, revision):
  """The snapshot folder of `repo` at `revision` in the cache (one that
  holds its config.json), or None."""
  found = huggingface_hub.try_to_load_from_cache(
      repo, hf.HF_CONFIG, revision=revision)
  return os.path.dirname(found) if isinstance(found, str) else None


def _whole(folder):
  """Whether `folder` holds config.json and whole weights: one file, or
  each shard its index names."""
  def has(name):
    return os.path.exists(os.path.join(folder, name))
  if not has(hf.HF_CONFIG):
    return False
  if has(hf.HF_WEIGHTS):
    return True
  try:
    with open(os.path.join(folder, hf.HF_INDEX)) as f:
      shards = set(json.load(f)["weight_map"].values())
  except (OSError, ValueError, KeyError, AttributeError):
    return False
  return all(has(shard) for shard in shards)


def _fetch(repo, revision, name):
  """Downloads config.json and the weights of `repo` at `revision` into
  the cache; their snapshot folder. Where the hub is off or out of reach,
  an InputError naming the command that fetches them."""
  def missing(why):
    flags = "".join(f" --include {_quoted(p)}" for p in PATTERNS)
    if revision:
      flags = f" --revision {revision}{flags}"
    return errors.InputError(
        f"{name} is not in the Hugging Face cache "
        f"({hub_constants.HF_HUB_CACHE}) and {why}; fetch it with: "
        f"hf download {repo}{flags}")

  if huggingface_hub.is_offline_mode():
    raise missing("the hub is off (HF_HUB_OFFLINE)")
  try:
    return huggingface_hub.snapshot_download(
        repo, revision=revision, allow_patterns=list(PATTERNS))
  except hub_errors.RevisionNotFoundError as e:
    raise errors.InputError(
        f"{name}: {repo} has no revision {revision!r} on the hub (a "
        "branch, a tag or a commit)") from e
  except hub_errors.RepositoryNotFoundError as e:  # Gated ones too.
    raise errors.InputError(
        f"{name}: no such repository on the hub, or it is private or "
        "gated: accept its terms on huggingface.co, then `hf auth login`"
    ) from e
  except (hub_errors.LocalEntryNotFoundError, hub_errors.HfHubHTTPError,
          ConnectionError) as e:
    # The library's own error wraps the one that says why (ConnectError).
    why = type(e.__cause__ or e).__name__
    raise missing(f"the hub could not be reached ({why})") from e


def _quoted(pattern):
  return f'"{pattern}"' if "*" in pattern else pattern


def _files(repo, folder):
  """The names of the files of `repo` at the commit of `folder`: the hub's
  listing of them where the cache kept it (a download does), else those
  the folder holds."""
  try:
    return {f.path for f in huggingface_hub.get_cached_repo_tree(
        repo, revision=os.path.basename(folder))}
  except hub_errors.CachedRepoTreeNotFoundError:
    return set(os.listdir(folder))


def _refuse_pickles(name, repo, files):
  """An InputError where `files` (of `repo`) hold weights as PyTorch
  pickles only."""
  if files & {hf.HF_WEIGHTS, hf.HF_INDEX}:
    return
  pickles = sorted(f for f in files if f.endswith(files_lib.PICKLE_SUFFIXES))
  if pickles:
    # The file itself given to vit_jax gets files_lib.refuse_pickle's
    # lines that convert it.
    raise errors.InputError(
        f"{name} holds its weights as PyTorch pickles only "
        f"({', '.join(pickles)}), which vit_jax never loads (unpickling "
        "runs the code a file holds); where you trust it, fetch one (hf "
        f"download {repo} {pickles[0]}) and give that file for the line "
        "that converts it to safetensors")


def _config(folder, what):
  try:
    with open(os.path.join(folder, hf.HF_CONFIG)) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise errors.InputError(f"{what}: its config.json is not JSON: {e}") from e


def _timm_heads(config):
  """A timm config's head count: its model_args', else its size's where
  timm's name says one of no paper width; None: from the width."""
  heads = (config.get("model_args") or {}).get("num_heads")
  if heads:
    return int(heads)
  parts = config.get("architecture", "").split("_")
  return TIMM_HEADS.get(parts[1]) if len(parts) > 1 else None


def _timm_normalization(config, what):
  """A timm config's Normalization (its pretrained_cfg's mean and std), or
  None where it gives none."""
  cfg = config.get("pretrained_cfg") or {}
  if "mean" not in cfg or "std" not in cfg:
    return None
  try:
    mean, std = (tuple(float(v) for v in cfg[key]) for key in ("mean", "std"))
  except (TypeError, ValueError) as e:
    raise errors.InputError(f"{what}: its config.json's pretrained_cfg mean "
                            f"and std are not numbers ({e})") from None
  if len(mean) != 3 or len(std) != 3:
    raise errors.InputError(f"{what}: its config.json's pretrained_cfg mean "
                            "and std take 3 numbers each (RGB)")
  return files_lib.Normalization(mean, std, "its hub config.json")
