"""A workdir guards its run: changed configs are refused, nothing written."""

import errno
import io
import json
import os

from vit_jax import train, writers
from tests.util import (finish, latest_checkpoint, main_flags, small_config,
                        start_main)


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
  train.train_and_evaluate(small_config(digits_data_dir), workdir)
  before = snapshot(workdir)

  code, stdout, stderr = finish(start_main(main_flags(
      workdir, digits_data_dir, **{"model.hidden_size": 48,
                                   "optimizer.learning_rate": 0.001})))
  assert code == 2  # A mistake of the user's (vit_jax/cli.py).
  last_lines = stderr.strip().splitlines()[-6:]
  assert any("model.hidden_size: 32 -> 48" in line for line in last_lines)
  assert any("optimizer.learning_rate: 0.003 -> 0.001" in line
             for line in last_lines)
  assert "Traceback" not in stderr
  assert "test_accuracy" not in stdout
  assert snapshot(workdir) == before


def test_extending_total_steps_is_allowed_and_recorded(digits_data_dir,
                                                       tmp_path):
  workdir = str(tmp_path)
  config = small_config(digits_data_dir, total_steps=3)
  train.train_and_evaluate(config, workdir)
  longer = small_config(digits_data_dir, total_steps=6, log_every=2)
  train.train_and_evaluate(longer, workdir)

  step, _, _ = latest_checkpoint(workdir, longer)
  assert step == 6
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  assert saved["total_steps"] == 6 and saved["log_every"] == 2
  with open(os.path.join(workdir, "config_changes.jsonl")) as f:
    changes = [json.loads(line)["changes"] for line in f]
  assert changes == [{"log_every": {"old": 3, "new": 2},
                      "total_steps": {"old": 3, "new": 6}}]


class _FillsUp(io.FileIO):
  """A file on a disk with room for 5 more bytes."""

  def write(self, data):
    if self.tell() >= self._full_at:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return super().write(bytes(data)[:self._full_at - self.tell()])


def test_a_row_that_does_not_fit_leaves_nothing_of_itself(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(b'{"step": 1}\n')
  with _FillsUp(path, "ab") as f:
    f._full_at = len(path.read_bytes()) + 5  # pylint: disable=protected-access
    try:
      writers.append_line(f, '{"step": 2, "train_loss": 0.5}')
    except OSError as e:
      assert e.errno == errno.ENOSPC
    else:
      raise AssertionError("the write should have failed")
  assert path.read_bytes() == b'{"step": 1}\n'
  with open(path, "ab", buffering=0) as f:
    writers.append_line(f, '{"step": 2}')
  assert path.read_bytes() == b'{"step": 1}\n{"step": 2}\n'
