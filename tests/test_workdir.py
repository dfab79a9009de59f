"""A workdir guards its run: changed configs are refused, nothing written."""

import errno
import io
import json
import os

import pytest

from tests.util import (
  call_tool,
  latest_checkpoint,
  main_flags,
  run_training,
  small_config,
  small_disk,
)
from vit_jax import errors, paths
from vit_jax.data import conversion, image_files, sources
from vit_jax.runs import settings, store, workdir as workdir_lib, writers
from vit_jax.runs.workdir import Workdir
from vit_jax.training import resolve


def snapshot(directory):
  """Every file under `directory` with its size, mtime and contents' hash."""
  files = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, directory)] = (
            os.stat(path).st_mtime_ns, hash(f.read()))
  return files


def test_a_changed_model_is_refused_before_anything_is_written(
    digits_data_dir, tmp_path):
  workdir = str(tmp_path)
  run_training(small_config(digits_data_dir), workdir)
  before = snapshot(workdir)

  code, stdout, stderr = call_tool("main", *main_flags(
      workdir, digits_data_dir, **{"model.hidden_size": 48,
                                   "optimizer.learning_rate": 0.001}))
  assert code == 2  # A mistake of the user's (vit_jax/cli/__init__.py).
  last_lines = stderr.strip().splitlines()[-6:]
  assert any("model.hidden_size: 32 -> 48" in line for line in last_lines)
  assert any("optimizer.learning_rate: 0.003 -> 0.001" in line
             for line in last_lines)
  assert "Traceback" not in stderr
  assert "test_accuracy" not in stdout
  assert snapshot(workdir) == before


def test_extending_total_steps_is_allowed_and_recorded(digits_data_dir,
                                                       tmp_path):
  """And the attention's implementation, which computes the same."""
  workdir = str(tmp_path)
  config = small_config(digits_data_dir, total_steps=3)
  run_training(config, workdir)
  longer = small_config(digits_data_dir, total_steps=6, log_every=2,
                        **{"model.attention": "fused"})
  run_training(longer, workdir)

  step, _, _ = latest_checkpoint(workdir, longer)
  assert step == 6
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  assert saved["total_steps"] == 6 and saved["log_every"] == 2
  assert saved["model"]["attention"] == "fused"
  with open(os.path.join(workdir, "config_changes.jsonl")) as f:
    changes = [json.loads(line)["changes"] for line in f]
  assert changes == [{"log_every": {"old": 3, "new": 2},
                      "model.attention": {"old": "einsum", "new": "fused"},
                      "total_steps": {"old": 3, "new": 6}}]


def test_a_new_mesh_and_more_micro_batches_are_allowed_and_recorded(
    digits_data_dir, tmp_path, caplog):
  """What a run moved to a slice of another shape changes: the mesh, and
  accum_steps where the new devices hold fewer examples at once."""
  workdir = str(tmp_path)
  run_training(small_config(digits_data_dir, total_steps=3),
                           workdir)
  moved = small_config(digits_data_dir, **{
      "total_steps": 6, "mesh.data": 2, "mesh.fsdp": 2, "accum_steps": 2})
  run_training(moved, workdir)

  assert latest_checkpoint(workdir, moved)[0] == 6
  with open(os.path.join(workdir, "config_changes.jsonl")) as f:
    changes, = [json.loads(line)["changes"] for line in f]
  assert changes == {
      "accum_steps": {"old": 1, "new": 2},
      "devices": {"old": "8 (data=4 x fsdp=1 x model=2)",
                  "new": "8 (data=2 x fsdp=2 x model=2)"},
      "mesh.data": {"old": 4, "new": 2}, "mesh.fsdp": {"old": 1, "new": 2},
      "total_steps": {"old": 3, "new": 6}}
  said = caplog.text
  assert "accum_steps: 1 -> 2" in said and "mesh.fsdp: 1 -> 2" in said
  # The batches are read as the run started: in the shares it chose.
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["input_shares"] == 16


def test_other_input_shares_are_refused_and_older_runs_keep_theirs(
    digits_data_dir, tmp_path):
  workdir = str(tmp_path)
  config = small_config(digits_data_dir)
  resolved = resolve.run(config, workdir).settings
  assert resolved.input_shares == 16  # 1,437 examples: 16 shares of 89.
  # remat_policy "auto", resolved off TPUs: every activation kept.
  assert config.model.remat_policy == "auto"
  assert resolved.model.remat_policy == ""
  assert (config.model.attention, resolved.model.attention) == (
      "auto", "einsum")
  store.record(resolved, Workdir(workdir), {})

  other = small_config(digits_data_dir, input_shares=8)
  with pytest.raises(errors.ConfigError, match="input_shares: 16 -> 8"):
    resolve.run(other, workdir)
  # A run recorded before input_shares read one share per data-parallel
  # device; it resumes so, with no change to refuse.
  path = os.path.join(workdir, "config.json")
  with open(path) as f:
    older = json.load(f)
  del older["input_shares"]
  # Recorded before "auto" was a remat policy or an attention.
  del older["model"]["remat_policy"], older["model"]["attention"]
  with open(path, "w") as f:
    json.dump(older, f)
  resumed = resolve.run(config, workdir)
  assert resumed.settings.input_shares == 4  # data 4 x fsdp 1.
  assert resumed.changes == {}


class _FillsUp(io.FileIO):
  """A file on a disk with room for `room` more bytes."""
  room = 5

  def write(self, data):
    fits = bytes(data)[:max(0, self.room - self.tell())]
    super().write(fits)
    if len(fits) < len(data):  # What a buffered file raises in the end.
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return len(data)


def test_metrics_that_do_not_fit_leave_the_file_as_it_was(tmp_path,
                                                          monkeypatch):
  workdir = Workdir(tmp_path)
  (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n')
  writer = writers.JsonlWriter(workdir, resume_step=1)
  # Every file the path layer writes goes through its own open().
  monkeypatch.setattr(paths, "open", lambda name, mode: _FillsUp(name, mode),
                      raising=False)
  with pytest.raises(OSError, match="No space left"):
    writer.write_scalars(2, {"train_loss": 0.5})
  assert (tmp_path / "metrics.jsonl").read_bytes() == b'{"step": 1}\n'
  assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl"]  # No temporary.
  monkeypatch.undo()
  writer.flush()  # Once there is room, every row is written.
  assert (tmp_path / "metrics.jsonl").read_bytes() == (
      b'{"step": 1}\n{"step": 2, "train_loss": 0.5}\n')
  # A resumed run drops the rows after its step, and a line cut short.
  (tmp_path / "metrics.jsonl").write_bytes(
      b'{"step": 1}\n{"step": 2, "train_loss": 0.5}\n{"step": 3, "tr')
  writers.JsonlWriter(workdir, resume_step=1)
  assert (tmp_path / "metrics.jsonl").read_bytes() == b'{"step": 1}\n'


def test_tools_write_in_a_workdir_only_under_its_exports_and_figures(
    tmp_path):
  run = Workdir(tmp_path / "run")
  run.write_config(settings.Settings(model=settings.Model(name="Ti/2")))
  recorded = (tmp_path / "run" / "config.json").read_bytes()
  for inside in (tmp_path / "run", tmp_path / "run" / "config.json",
                 tmp_path / "run" / "checkpoints" / "model.npz"):
    with pytest.raises(errors.InputError, match="inside the workdir of a run"):
      workdir_lib.check_output(str(inside), "--out")
  for allowed in (f"{run.exports}/model.npz", run.exports, run.figures,
                  str(tmp_path / "model.npz")):
    workdir_lib.check_output(allowed, "--out")
  # An HF export written again: its config.json is the export's, beside
  # its weights, not a run's.
  export = tmp_path / "hf"
  export.mkdir()
  (export / "config.json").write_text('{"model_type": "vit"}')
  (export / "model.safetensors").write_bytes(b"")
  workdir_lib.check_output(str(export), "--out")
  # The command of issue "Every tool as careful": the run's config.json was
  # replaced by the HF one.
  code, _, stderr = call_tool("export", f"--workdir={run}", f"--out={run}",
                              "--format=hf")
  assert code == 2, stderr[-2000:]
  assert stderr.startswith(f"error: --out={run} is inside")
  assert (tmp_path / "run" / "config.json").read_bytes() == recorded


def test_a_labels_file_must_name_every_class(tmp_path):
  labels = tmp_path / "labels.txt"
  labels.write_text("cat\ndog\n")
  assert image_files.name_classes(str(labels), num_classes=2) == ["cat",
                                                                  "dog"]
  with pytest.raises(errors.InputError, match="2 names for the model's 3"):
    image_files.name_classes(str(labels), num_classes=3)


def test_converting_into_the_tfrecord_folder_is_refused(
    digits_tfrecord_data_dir):
  builder = sources.get_builder("digits", digits_tfrecord_data_dir)
  with pytest.raises(errors.InputError, match="give another folder"):
    conversion.convert(builder, digits_tfrecord_data_dir)


def test_damaged_run_files_are_named_in_one_line(tmp_path):
  run = Workdir(tmp_path)
  (tmp_path / "config.json").write_text('{"model": {"name": "Ti/')
  with pytest.raises(errors.InputError, match="config.json is damaged"):
    run.read_config()
  with pytest.raises(errors.InputError, match="is a file, not a workdir"):
    Workdir("/etc/passwd").read_config()
  # A metrics file that ends in bytes that are not UTF-8 (a disk's garbage):
  # its rows read, and a resumed run drops the line.
  (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n\xff\xfe\x00')
  assert writers.read_rows(run) == [{"step": 1}]
  writers.JsonlWriter(run, resume_step=1)
  assert (tmp_path / "metrics.jsonl").read_bytes() == b'{"step": 1}\n'


def test_a_write_that_fails_names_its_target(tmp_path, monkeypatch):
  target = tmp_path / "model.npz"
  target.write_bytes(b"the old file")
  monkeypatch.setattr(paths, "open", lambda name, mode: _FillsUp(name, mode),
                      raising=False)
  with pytest.raises(OSError) as raised:
    paths.write_atomically(target, b"x" * 100)
  assert raised.value.filename == str(target)
  assert "No space left" in raised.value.strerror
  assert target.read_bytes() == b"the old file"


def test_an_export_onto_a_full_disk_keeps_the_file_it_replaces(tmp_path):
  # The command of issue "Every tool as careful": `export --out=prev.npz`
  # onto a nearly full disk left a 294,912-byte file that was no zip, and
  # `--format=hf` there a SafetensorError traceback.
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.weights import npz  # pylint: disable=g-import-not-at-top
  model = models.create("Ti/2", 10, hidden_size=64, num_layers=4,
                        mlp_dim=256, num_heads=2)
  params = model.init(jax.random.key(0), np.zeros((1, 8, 8, 3), np.float32),
                      train=False)["params"]
  source = str(tmp_path / "model.npz")  # About 0.8 MB.
  npz.save_npz(params, source)
  with small_disk(tmp_path / "disk", "256k") as disk:
    previous = os.path.join(disk, "prev.npz")
    np.savez(previous, kept=np.arange(10))
    kept = open(previous, "rb").read()
    for out, extra in ((previous, []), (os.path.join(disk, "hf"),
                                        ["--format=hf"])):
      code, _, stderr = call_tool("export", f"--from={source}",
                                  f"--out={out}", *extra)
      assert code == 2, stderr[-3000:]
      assert "Traceback" not in stderr, stderr[-3000:]
      assert stderr.startswith("error: "), stderr
      assert "No space left on device" in stderr, stderr
      assert disk in stderr, stderr  # The path is named.
    assert open(previous, "rb").read() == kept
    # No part left.
    assert [name for _, _, names in os.walk(disk) for name in names] == [
        "prev.npz"]


@pytest.mark.parametrize("key,value,named", [
    ("train_split", "train[:0]", "config.train_split"),
    ("evaluators.test.split", "test[:0]", "config.evaluators.test"),
])
def test_an_empty_split_is_refused_before_anything_is_written(
    digits_data_dir, tmp_path, key, value, named):
  config = small_config(digits_data_dir, **{key: value})
  with pytest.raises(errors.ConfigError, match="holds no examples") as raised:
    resolve.run(config, str(tmp_path / "run"))
  assert named in str(raised.value) or "train[:0]" in str(raised.value)
  assert not os.path.exists(tmp_path / "run")


def test_a_dataset_of_one_class_is_refused(tmp_path):
  from tests.test_folder_dataset import write_png  # pylint: disable=g-import-not-at-top
  for i in range(4):
    write_png(tmp_path / "images" / "cat" / f"{i}.png")
  config = small_config(str(tmp_path / "data"),
                        dataset=f"folder:{tmp_path / 'images'}")
  with pytest.raises(errors.ConfigError, match="has 1 class"):
    resolve.run(config, str(tmp_path / "run"))
