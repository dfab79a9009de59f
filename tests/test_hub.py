"""Models by their hub names, hf://ORG/NAME[@REVISION]
(vit_jax/weights/hub.py).

The Hugging Face cache is built here in huggingface_hub's own layout (a
blob per file, the snapshot of a commit linking to them, refs naming the
commits) from the tiny transformers and timm files of
test_torch_interchange.py and test_todays_checkpoints.py, and the hub is
off (HF_HUB_OFFLINE): no test reaches the network.
"""

import hashlib
import json
import os
import pathlib

import pytest
from huggingface_hub import constants as hub_constants

from tests.test_finetune import flat
from tests.test_todays_checkpoints import (
  REGISTERS,
  TIMM_CASES,
  dinov2_config,
  dinov2_shapes,
  dinov3_config,
  dinov3_shapes,
  eva_dinov3_file,
  siglip_tensors,
  timm_file,
)
from tests.test_torch_interchange import (
  CLASSES,
  HEADS,
  WIDTH,
  hf_config,
  hf_shapes,
  random_tensors,
  write_hf_dir,
)
from tests.util import assert_trees_equal, call_tool, program_of, small_config
from vit_jax import cli, errors
from vit_jax.runs import settings, store
from vit_jax.runs.workdir import Workdir
from vit_jax.training import distill
from vit_jax.weights import adaptation, hub, pretrained

COMMIT = hashlib.sha1(b"the first").hexdigest()
LATER = hashlib.sha1(b"a later one").hexdigest()


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty Hugging Face cache, the hub off: huggingface_hub read the
  environment when it was imported, so its constants are set too."""
  home = tmp_path / "hf"
  monkeypatch.setenv("HF_HOME", str(home))
  monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(home / "hub"))
  monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
  return home / "hub"


def put(cache, repo, files, commit=COMMIT, refs=("main",), listing=None):
  """Puts `files` ({name in the repository: a local file}) in `cache` as
  the snapshot of `repo` at `commit`, as a download leaves them: each a
  blob the snapshot links to; `refs` (branches, tags) name the commit;
  `listing`: the repository's files, as a download keeps the hub's list.
  Returns the hub name."""
  root = cache / f"models--{repo.replace('/', '--')}"
  snapshot = root / "snapshots" / commit
  for folder in (snapshot, root / "blobs", root / "refs"):
    folder.mkdir(parents=True, exist_ok=True)
  for name, source in files.items():
    data = pathlib.Path(source).read_bytes()
    blob = root / "blobs" / hashlib.sha256(data).hexdigest()
    blob.write_bytes(data)
    (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
  for ref in refs:
    (root / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
  if listing is not None:
    (root / "trees").mkdir(exist_ok=True)
    (root / "trees" / f"{commit}.json").write_text(json.dumps({
        "format_version": 1, "files": {
            name: {"size": 1, "blob_id": "0" * 40} for name in listing}}))
  return f"hf://{repo}"


def put_dir(cache, repo, directory, **kwargs):
  return put(cache, repo, {name: os.path.join(directory, name)
                           for name in os.listdir(directory)}, **kwargs)


def vit_dir(directory, seed=0):
  return write_hf_dir(directory, random_tensors(hf_shapes(), seed),
                      hf_config())


def timm_repo(directory):
  """(a timm repository's folder, its file): model.safetensors and timm's
  config.json, whose model_args name the head count (the width is no
  paper variant's)."""
  _, path = timm_file(directory, TIMM_CASES["map, registers, layer scale"][0])
  folder = directory / "timm_repo"
  folder.mkdir()
  os.rename(path, folder / "model.safetensors")
  (folder / "config.json").write_text(json.dumps({
      "architecture": "vit_test_patch2_16", "num_classes": CLASSES,
      "num_features": WIDTH, "global_pool": "map",
      "model_args": {"num_heads": HEADS},
      "pretrained_cfg": {"tag": "test", "input_size": [3, 16, 16]}}))
  return folder, str(folder / "model.safetensors")


def test_hub_names_read_as_their_files(cache, tmp_path):
  """An HF ViT, a SigLIP 2 tower, a DINOv2 and a timm model: by its name,
  each is its files in the cache, called by its name and commit."""
  siglip2 = write_hf_dir(tmp_path / "siglip2", *siglip_tensors(True, "hub"))
  dinov2 = write_hf_dir(tmp_path / "dinov2", random_tensors(
      dinov2_shapes(REGISTERS)), dinov2_config(REGISTERS))
  timm_folder, timm_path = timm_repo(tmp_path)
  repos = {"google/vit-tiny": (vit_dir(tmp_path / "vit"), None),
           "google/siglip2-tiny": (siglip2, None),
           "facebook/dinov2-with-registers-tiny": (dinov2, None),
           "timm/vit_test_patch2_16.test": (timm_folder, timm_path)}
  for repo, (folder, file) in repos.items():
    name = put_dir(cache, repo, folder)
    loaded = pretrained.load(name)  # timm's head count from its config
    direct = pretrained.load(file or folder, HEADS)
    assert_trees_equal(loaded.params, direct.params)
    assert (loaded.function, loaded.class_names) == (direct.function,
                                                     direct.class_names)
    assert loaded.what == f"{name}@{COMMIT[:7]}"
    assert pretrained.source_options(name) == pretrained.source_options(
        file or folder)
    assert pretrained.local(name).name == f"{name}@{COMMIT}"
  inference = pretrained.for_inference("hf://google/vit-tiny")
  assert inference.what == f"hf://google/vit-tiny@{COMMIT[:7]}"
  assert inference.class_names[0] == "class 0"


def test_dinov3s_by_name_read_as_their_files_with_their_own_input(
    cache, tmp_path):
  """A transformers DINOv3 with its image processor's config and a timm
  DINOv3 with timm's config: by name, each is its files, and its input is
  what its repository says (no line of what is assumed)."""
  hf = write_hf_dir(tmp_path / "dinov3", random_tensors(dinov3_shapes()),
                    dinov3_config())
  (tmp_path / "dinov3" / "preprocessor_config.json").write_text(json.dumps({
      "do_normalize": True, "image_mean": [0.4, 0.5, 0.6],
      "image_std": [0.2, 0.25, 0.3]}))
  folder = tmp_path / "timm_dinov3"
  folder.mkdir()
  _, path = eva_dinov3_file(folder)
  os.rename(path, folder / "model.safetensors")
  (folder / "config.json").write_text(json.dumps({
      "architecture": "vit_small_patch16_dinov3", "num_classes": 0,
      "model_args": {"num_heads": HEADS},
      "pretrained_cfg": {"mean": [0.485, 0.456, 0.406],
                         "std": [0.229, 0.224, 0.225]}}))
  for repo, directory, file, said_by in (
      ("facebook/dinov3-tiny", hf, None, "its preprocessor_config.json"),
      ("timm/vit_small_patch16_dinov3.test", folder,
       str(folder / "model.safetensors"), "its hub config.json")):
    name = put_dir(cache, repo, directory)
    loaded = pretrained.load(name)
    direct = pretrained.load(file or directory, HEADS)
    assert_trees_equal(loaded.params, direct.params)
    assert loaded.function == direct.function
    assert loaded.normalization.said_by == said_by
    status, _, stderr = call_tool("predict", f"--from={name}", "--features",
                                  "--json", "--max_num_patches=16",
                                  "docs/digits_attention_rollout.png")
    assert status == 0 and "note:" not in stderr, stderr[-2000:]


def test_a_fine_tune_starts_from_the_commit_and_records_it(cache, tmp_path):
  folder = vit_dir(tmp_path / "vit")
  name = put_dir(cache, "google/vit-tiny", folder)
  config = pretrained.with_source(settings.of(small_config(
      str(tmp_path), init_from=name)))
  assert config.init_from == f"{name}@{COMMIT}"
  # The run's start (step.initial_state's): read from the commit recorded.
  program = program_of(config)
  shapes = program.state_shapes.params
  started = flat(pretrained.initial_params(
      config.init_from, shapes, program.model.config.num_heads))
  expected = flat(adaptation.adapt(pretrained.load(folder).params, shapes))
  assert started.keys() == expected.keys()
  assert_trees_equal(started, expected)

  # Main moves on; the run resumes from its own checkpoint, its config.json
  # unchanged whether the name gives the branch, no revision or the commit.
  put_dir(cache, "google/vit-tiny", vit_dir(tmp_path / "later", seed=1),
          commit=LATER)
  workdir = Workdir(str(tmp_path / "run"))
  store.record(config, workdir, {})
  recorded = workdir.read_config()
  for given in (name, f"{name}@main", f"{name}@{COMMIT}"):
    resumed = pretrained.with_source(
        settings.of(small_config(str(tmp_path), init_from=given)), recorded)
    assert resumed.init_from == f"{name}@{COMMIT}"
    assert store.differences_allowed(resumed, recorded, workdir) == {}
  # Another commit, or another model, is another experiment.
  for given in (f"{name}@{LATER}", "hf://google/vit-other"):
    resumed = pretrained.with_source(
        settings.of(small_config(str(tmp_path), init_from=given)), recorded)
    with pytest.raises(errors.ConfigError, match="init_from"):
      store.differences_allowed(resumed, recorded, workdir)
  # A new run takes main as it is now.
  assert pretrained.with_source(settings.of(small_config(
      str(tmp_path), init_from=name))).init_from == f"{name}@{LATER}"


def test_a_revision_is_a_commit_a_branch_or_a_tag(cache, tmp_path):
  first = put_dir(cache, "org/vit", vit_dir(tmp_path / "first"))
  later = vit_dir(tmp_path / "later", seed=1)
  put_dir(cache, "org/vit", later, commit=LATER, refs=("v2", "refs/pr/1"))
  expected = pretrained.load(later).params
  for revision in (LATER, "v2", "refs/pr/1"):
    loaded = pretrained.load(f"{first}@{revision}")
    assert_trees_equal(loaded.params, expected)
    assert loaded.what == f"hf://org/vit@{LATER[:7]}"
  assert pretrained.local(first).name == f"{first}@{COMMIT}"
  # A revision not in the cache: named, with the command that fetches it.
  with pytest.raises(errors.InputError) as raised:
    pretrained.load(f"{first}@v3")
  assert str(raised.value).startswith("hf://org/vit@v3 is not in the")
  assert "hf download org/vit --revision v3 --include" in str(raised.value)


def test_a_name_not_in_the_cache_is_named_with_the_command_that_fetches_it(
    cache, tmp_path, monkeypatch):
  with pytest.raises(errors.InputError) as raised:
    pretrained.load("hf://google/siglip2-base-patch16-224")
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith("hf://google/siglip2-base-patch16-224 is not in "
                            f"the Hugging Face cache ({cache})")
  assert message.endswith(
      "fetch it with: hf download google/siglip2-base-patch16-224 "
      '--include config.json --include "model*.safetensors*" --include '
      "preprocessor_config.json")
  with pytest.raises(errors.ConfigError) as raised:
    pretrained.with_source(settings.of(small_config(
        str(tmp_path), init_from="hf://nobody/missing")))
  assert str(raised.value).startswith(
      "config.init_from='hf://nobody/missing': hf://nobody/missing is not")

  # The hub on but out of reach (a port nothing listens on): the same.
  monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
  monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")
  with pytest.raises(errors.InputError,
                     match="could not be reached .* hf download nobody"):
    pretrained.load("hf://nobody/missing")


def test_pickles_and_what_is_no_model_are_refused_by_name(cache, tmp_path):
  config = tmp_path / "config.json"
  config.write_text(json.dumps(hf_config()))
  pickle = tmp_path / "pytorch_model.bin"
  pickle.write_bytes(b"\x80\x02not to be unpickled")
  # Fetched whole, or only what vit_jax fetches (the hub's list kept).
  put(cache, "old/vit", {"config.json": config, "pytorch_model.bin": pickle})
  put(cache, "old/vit-listed", {"config.json": config}, listing=[
      ".gitattributes", "config.json", "pytorch_model.bin"])
  for name in ("hf://old/vit", "hf://old/vit-listed"):
    with pytest.raises(errors.InputError) as raised:
      pretrained.load(name)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{name} holds its weights as PyTorch "
                              "pickles only (pytorch_model.bin)")

  folder = vit_dir(tmp_path / "vit")
  (tmp_path / "other.json").write_text(json.dumps({"name": "resnet"}))
  name = put(cache, "org/other", {
      "config.json": tmp_path / "other.json",
      "model.safetensors": os.path.join(folder, "model.safetensors")})
  with pytest.raises(errors.InputError, match="no transformers model_type"):
    pretrained.load(name)

  for name in ("hf://google", "hf://google/vit/more", "hf://google/vit@",
               "hf://google/vit@a b", "hf://go--ogle/vit", "hf://google/vit:5",
               "hf://google/-vit", "hf://google/vit@v..2"):
    with pytest.raises(errors.InputError, match="is no hub name") as raised:
      pretrained.load(name)
    assert "\n" not in str(raised.value) and repr(name) in str(raised.value)


def test_a_tool_names_the_missing_model_and_its_fetch(cache, tmp_path):
  # The cache fixture's Hugging Face home, tmp_path/hf, the hub off. An
  # image that is there: predict looks for the images first.
  code, stdout, stderr = call_tool(
      "predict", "--from=hf://nobody/missing",
      "--images=docs/digits_attention_rollout.png")
  assert code == cli.EXIT_USER_ERROR, stderr[-3000:]
  assert "Traceback" not in stderr + stdout
  lines = stderr.strip().splitlines()
  assert len(lines) == 1, stderr
  assert lines[0].startswith("error: hf://nobody/missing is not in the "
                             f"Hugging Face cache ({tmp_path}/hf/hub)")
  assert "hf download nobody/missing" in lines[0]


def test_a_resume_keeps_what_it_recorded_of_any_other_source():
  assert hub.as_recorded("/models/vit", "/models/vit") == "/models/vit"
  assert hub.as_recorded("hf://a/b", "/models/vit") == "hf://a/b"
  assert hub.as_recorded("hf://a/b@v2", f"hf://a/b@{COMMIT}") == (
      f"hf://a/b@{COMMIT}")


def test_a_teacher_by_its_hub_name_is_pinned_to_its_commit(cache, tmp_path):
  """As init_from's: the run records the commit, and a resume that names the
  same repository keeps it while main moves on."""
  name = put_dir(cache, "google/vit-tiny", vit_dir(tmp_path / "vit"))
  keys = distill.pinned(settings.of(small_config(
      str(tmp_path), **{"distill.teacher": name})))
  assert keys.distill.teacher == f"{name}@{COMMIT}"
  assert distill.load(keys).what == f"{name}@{COMMIT[:7]}"
  put_dir(cache, "google/vit-tiny", vit_dir(tmp_path / "later", seed=1),
          commit=LATER)
  workdir = Workdir(str(tmp_path / "run"))
  store.record(keys, workdir, {})
  recorded = workdir.read_config()
  resumed = distill.pinned(settings.of(small_config(
      str(tmp_path), **{"distill.teacher": f"{name}@main"})), recorded)
  assert resumed.distill.teacher == f"{name}@{COMMIT}"
  assert store.differences_allowed(resumed, recorded, workdir) == {}
  other = distill.pinned(settings.of(small_config(
      str(tmp_path), **{"distill.teacher": f"{name}@{LATER}"})), recorded)
  with pytest.raises(errors.ConfigError, match="distill.teacher"):
    store.differences_allowed(other, recorded, workdir)
