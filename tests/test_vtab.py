"""VTAB-1k: configs/vtab.py against Table 4, every task's config checked on
its splits' real sizes, and the runner's table from two shrunk tasks run on
random examples."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from configs import vtab as vtab_config
from tests.test_table2 import TINY_MODEL, _split_dict
from tests.test_vtab_registry import SPLIT_SIZES
from tests.util import call_tool, check_config, mocked_tfds
from vit_jax import errors
from vit_jax.data import vtab_tasks as registry
from vit_jax.training import finetune_suite


@pytest.fixture(scope="module")
def vtab_data_dir(tmp_path_factory):
  """The splits' real sizes, for the checks to read."""
  data_dir = str(tmp_path_factory.mktemp("vtab_metadata"))
  for task in registry.TASKS.values():
    builder = tfds.builder(task.tfds_name, data_dir=data_dir)
    name = task.tfds_name.split(":")[0].split("/")[0]
    builder.info.set_splits(_split_dict(SPLIT_SIZES[name]))
    os.makedirs(builder.data_path, exist_ok=True)
    builder.info.write_to_directory(builder.data_path)
  return data_dir


def test_config_is_table4():
  config = vtab_config.get_config("L/16")
  assert config.total_steps == 2_500 and config.batch_size == 512
  assert config.image_size == 384
  assert vtab_config.get_config("H/14").image_size == 378  # 27 x 14.
  opt = config.optimizer
  assert (opt.name, opt.learning_rate, opt.decay, opt.weight_decay,
          opt.grad_clip_norm, opt.momentum) == ("sgd", 0.01, "cosine", 0.0,
                                                1.0, 0.9)
  assert config.model.representation_size is None
  assert config.model.dropout_rate == 0.0
  assert config.augment == ""  # A flip would change dSprites' answers.


@pytest.mark.parametrize("name", list(registry.TASKS))
def test_every_task_config_fits_its_splits(vtab_data_dir, name):
  task = registry.get(name)
  for val, trained, scored in ((False, "train800val200", "test"),
                               (True, "train800", "val200")):
    config = vtab_config.get_config(f"L/16,{name}" + (",val" if val else ""))
    config.data_dir = vtab_data_dir
    assert config.dataset == f"vtab:{name}"
    assert config.train_split == task.splits[trained]
    [(metric, evaluator)] = config.evaluators.items()
    assert metric == ("val" if val else "test")
    assert evaluator.split == task.splits[scored]
    assert evaluator.every == 2_500
    check_config(config)


def test_task_selection():
  assert len(registry.select("all")) == 19
  chosen = registry.select("clevr_count,natural")
  assert [t.name for t in chosen] == [t.name for t in registry.TASKS.values()
                                      if t.group == "natural"] + [
                                          "clevr_count"]
  with pytest.raises(errors.InputError, match="caltech101"):
    registry.select("imagenet")


def test_summary_means_and_table():
  accuracies = {"caltech101": 0.9, "dtd": 0.7, "eurosat": 0.95,
                "clevr_count": 0.5}
  summary = finetune_suite.summarise(accuracies, "test")
  assert summary["groups"] == pytest.approx(
      {"natural": 0.8, "specialized": 0.95, "structured": 0.5})
  assert summary["mean"] == pytest.approx(0.7625)
  assert not summary["complete"]
  table = finetune_suite.markdown(summary)
  assert "| Natural | DTD | 70.00 |" in table
  assert "| Natural | **mean** | **80.00** |" in table
  assert "| All | **mean of 4** | **76.25** |" in table
  assert "Only 4 of the 19 tasks" in table


def records(builder, split, decoders=None, **_):
  """16 examples of any VTAB dataset run here: caltech101's RGB images and
  labels, dsprites' 0/1 grayscale images and x positions."""
  del split, decoders
  rng = np.random.default_rng(0)
  if builder.name == "dsprites":
    images = [tf.io.encode_png(rng.integers(0, 2, (64, 64, 1), np.uint8))
              for _ in range(16)]
    return tf.data.Dataset.from_tensor_slices({
        "image": [i.numpy() for i in images],
        "label_x_position": np.arange(16) * 2})
  images = [tf.io.encode_jpeg(rng.integers(0, 256, (40, 30, 3), np.uint8))
            for _ in range(16)]
  return tf.data.Dataset.from_tensor_slices({
      "image": [i.numpy() for i in images], "label": np.arange(16)})


def test_runner_tabulates_two_shrunk_tasks(vtab_data_dir, tmp_path,
                                           monkeypatch):
  config = vtab_config.get_config("B/16")
  config.model.update(TINY_MODEL)
  config.update(image_size=32, batch_size=16, total_steps=2, log_every=1,
                checkpoint_every=2, data_dir=vtab_data_dir)
  config.mesh.update(data=8, fsdp=1, model=1)
  config.optimizer.warmup_steps = 1
  tasks = []
  for task in registry.select("caltech101,dsprites_location"):
    # Scoring the whole test splits would be thousands of padded batches.
    test = task.splits["test"].split("[")[0] + "[-64:]"
    tasks.append(dataclasses.replace(task, splits={**task.splits,
                                                   "test": test}))
    monkeypatch.setitem(registry.TASKS, task.name, tasks[-1])
  with mocked_tfds(vtab_data_dir, records):
    summary = finetune_suite.run(config, str(tmp_path), tasks)
  assert set(summary["tasks"]) == {"caltech101", "dsprites_location"}
  for name, result in summary["tasks"].items():
    metrics = [json.loads(line) for line in
               open(tmp_path / name / "metrics.jsonl")]
    assert metrics[-1]["test_accuracy"] == result["accuracy"]
    # Scored on the 64 examples of the shrunk test split ("[-64:]"), each
    # once: a whole number of them right.
    assert metrics[-1]["test_examples"] == 64
    assert result["accuracy"] * 64 in range(65)
    assert metrics[-1]["step"] == 2
  finetune_suite.write(summary, str(tmp_path))
  assert json.load(open(tmp_path / "vtab.json")) == summary
  assert "| Structured | dSprites-Loc |" in open(tmp_path / "vtab.md").read()


def test_command_line_names_the_tasks_it_knows(tmp_path):
  code, _, stderr = call_tool("vtab", "--config=configs/vtab.py:L/16",
                              f"--workdir={tmp_path}",
                              "--tasks=natural,imagenet")
  assert code == 2
  assert "Unknown VTAB task 'imagenet'; valid: caltech101" in stderr
  assert not os.listdir(tmp_path)  # Nothing trained, nothing written.
