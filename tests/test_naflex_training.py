"""NaFlex training (config.naflex.max_num_patches): a fine-tune on a folder
of images of four aspect ratios, each seen at its own grid, that learns
and resumes bitwise after SIGTERM (sent in this process)."""

import json
import os
import random

import numpy as np
import pytest
import sklearn.datasets
import tensorflow as tf

from tests.util import (
  assert_trees_equal,
  call_tool,
  latest_checkpoint,
  made_once,
  metric_rows,
  run_training,
  sigterm_at_step,
  small_config,
)
from vit_jax import errors
from vit_jax.data import pipeline, sources
from vit_jax.models import naflex
from vit_jax.runs import settings
from vit_jax.training import resolve

# Canvases of 1 x 1, 1 x 2, 2 x 1 and 1 x 3 digits (8 x 8 pixels each),
# the digit in one cell of it, the rest black.
CANVASES = [(1, 1), (1, 2), (2, 1), (1, 3)]
CLASSES = 5
BUDGET = 32  # Patches of 2 x 2: a digit alone is 16 of them.


def write_folder(root):
  """root/{train,test}/<digit>/<i>.png: digits 0-4 of scikit-learn's set,
  one in five in test."""
  digits = sklearn.datasets.load_digits()
  for i, (image, label) in enumerate(zip(digits.images[:640],
                                         digits.target[:640])):
    if label >= CLASSES:
      continue
    rows, cols = CANVASES[i % len(CANVASES)]
    canvas = np.zeros((8 * rows, 8 * cols, 1), np.uint8)
    row, col = (i // 4) % rows, (i // 4) % cols
    canvas[8 * row:8 * row + 8, 8 * col:8 * col + 8, 0] = image * 15
    split = "test" if i % 5 == 0 else "train"
    folder = os.path.join(root, split, str(label))
    os.makedirs(folder, exist_ok=True)
    tf.io.write_file(os.path.join(folder, f"{i}.png"),
                     tf.io.encode_png(canvas))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return made_once(tmp_path_factory, "naflex_digits", write_folder)


# Fine-tuned from the session's digits run (square 8 x 8 images, a 4 x 4
# position table), whose table is resized to every image's grid. Data
# parallel only: on a data 4 x model 2 mesh, this step loaded from the
# session's compilation cache deadlocked in XLA:CPU's collectives (two
# device groups at different all-reduces), where compiling it afresh ran.
RUN = {"mesh.data": 8, "mesh.model": 1,
       "image_size": 8, "naflex.max_num_patches": BUDGET,
       "model.hidden_size": 64, "model.mlp_dim": 128,
       "model.scan_layers": True, "model.dropout_rate": 0.0,
       "batch_size": 32, "total_steps": 24, "log_every": 1,
       "checkpoint_every": 8, "evaluators.test.every": 24,
       "optimizer.warmup_steps": 2, "optimizer.learning_rate": 3e-3}


def run_settings(folder, data_dir, digits_workdir):
  return {**RUN, "dataset": f"folder:{folder}", "data_dir": data_dir,
          "init_from": digits_workdir}


@pytest.fixture(scope="module")
def uninterrupted(folder, digits_run, tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("naflex_data"))
  overrides = run_settings(folder, data_dir, digits_run[0])
  config = small_config(**overrides)
  workdir = made_once(tmp_path_factory, "naflex_uninterrupted",
                      lambda path: run_training(config, path))
  return overrides, config, workdir


def test_the_batches_hold_every_aspect_ratio_with_little_padding(
    uninterrupted):
  overrides, _, _ = uninterrupted
  source = sources.lookup(overrides["dataset"], overrides["data_dir"])
  batch = next(pipeline.train_dataset(
      source, "train", batch_size=32, image_size=8, seed=0,
      naflex=naflex.Budget(2, BUDGET)).as_numpy_iterator())
  assert batch["image"].shape == (32, BUDGET, 12)
  grids = {tuple(grid) for grid in batch["grid"]}
  assert grids == {naflex.grid_for(8 * rows, 8 * cols, 2, BUDGET)
                   for rows, cols in CANVASES}, grids
  assert (3, 9) in grids  # 1 x 3 digits, shrunk to the budget.
  real = batch["grid"].prod(axis=1)
  assert real.sum() / batch["image"][:, :, 0].size > 0.7
  # The padding is zeros; the real patches are the image's.
  for pixels, count in zip(batch["image"], real):
    assert not pixels[count:].any()


def test_a_naflex_fine_tune_learns_and_resumes_bitwise_after_sigterm(
    uninterrupted, tmp_path, request, monkeypatch):
  _, config, finished = uninterrupted
  step, expected, _ = latest_checkpoint(finished, config, CLASSES)
  assert step == RUN["total_steps"]
  losses = [r["train_loss"] for r in metric_rows(finished)
            if "train_loss" in r]
  accuracy = [r["test_accuracy"] for r in metric_rows(finished)
              if "test_accuracy" in r]
  # From a weak source (the digits run: 0.7 on square digits) in 24 steps:
  # 1.58 -> 1.07 and 0.66 held out when written.
  assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])
  assert accuracy[-1] > 0.45  # Of 5 classes: chance is 0.2.

  # Stopped by a SIGTERM in this process (tests/test_preemption.py sends
  # it to a process of its own), at a step drawn from the test's name: the
  # same on every run, so that a failure at it can be run again.
  workdir = str(tmp_path)
  with monkeypatch.context() as patch:
    sigterm_at_step(patch, random.Random(request.node.name).randint(3, 18))
    stopped = run_training(config, workdir)["stopped_at_step"]
  assert stopped < RUN["total_steps"]
  assert latest_checkpoint(workdir, config, CLASSES)[0] == stopped
  run_training(config, workdir)
  step, params, _ = latest_checkpoint(workdir, config, CLASSES)
  assert step == RUN["total_steps"]
  assert_trees_equal(params, expected)


def test_predict_reads_a_naflex_runs_images_as_its_evaluation_did(
    uninterrupted, folder):
  """Without --max_num_patches, predict reads a NaFlex run's images as its
  evaluation did, each at its own aspect ratio under the run's budget
  (what --max_num_patches=32 gives); --max_num_patches=0 reads them
  square instead, which gives other probabilities."""
  _, _, workdir = uninterrupted
  test = os.path.join(folder, "test")
  files = [os.path.join(test, label, name)
           for label in sorted(os.listdir(test))
           for name in sorted(os.listdir(os.path.join(test, label)))[:2]]

  def predicted(*given):
    status, out, err = call_tool("predict", f"--workdir={workdir}",
                                 f"--top={CLASSES}", "--json", *given,
                                 *files)
    assert status == 0, err
    shown = np.zeros((len(files), CLASSES))
    for row, line in zip(shown, out.splitlines()):
      for top in json.loads(line)["top"]:
        row[top["class"]] = top["probability"]
    return shown

  by_default = predicted()
  np.testing.assert_array_equal(by_default,
                                predicted(f"--max_num_patches={BUDGET}"))
  assert np.abs(predicted("--max_num_patches=0") - by_default).max() > 0.01


@pytest.mark.parametrize("overrides, says", [
    ({"mixup.prob": 0.5}, "Mixup and CutMix"),
    ({"randaugment": "2,10"}, "RandAugment"),
    ({"model.name": "R26+Ti/32", "image_size": 32}, "ResNet stem"),
])
def test_what_a_naflex_run_refuses(overrides, says):
  config = small_config("/nonexistent", **{
      "naflex.max_num_patches": 16, **overrides})
  with pytest.raises(errors.ConfigError,
                     match=f"naflex.max_num_patches: .*{says}"):
    resolve.program(settings.of(config))


def test_a_budget_whose_attention_cannot_fit_a_device_is_refused_up_front():
  """Before anything is built on the devices: 4 images a device (32 over
  8), 4 heads, 100,001 tokens squared, float32 logits and softmax."""
  config = small_config("/nonexistent", **{
      "naflex.max_num_patches": 100_000, "batch_size": 32, "mesh.data": 8,
      "mesh.model": 1, "model.num_heads": 4})
  with pytest.raises(errors.ConfigError, match=(
      r"^config.naflex.max_num_patches=100000: 4 images' attention alone "
      r"would take 1,280 GB \(4 heads x 100,000 patches squared, float32\), "
      r"more than the device's [\d,]+ GB; give a smaller budget, fewer "
      r"images per device")):
    resolve.program(settings.of(config))
  # The fused attention keeps no weights: the same budget is built.
  resolve.program(settings.of(small_config("/nonexistent", **{
      "naflex.max_num_patches": 100_000, "batch_size": 32, "mesh.data": 8,
      "mesh.model": 1, "model.num_heads": 4, "model.attention": "fused"})))


def test_the_plan_compiles_the_step_at_the_budget():
  """vit_jax.plan's program of a NaFlex config takes patches and grids at
  the budget, and compiles (here for the CPU devices)."""
  import jax  # pylint: disable=g-import-not-at-top

  from vit_jax.planning import cost  # pylint: disable=g-import-not-at-top
  keys = settings.of(small_config("/nonexistent",
                                  **{"naflex.max_num_patches": 24}))
  program, batch = cost.build_step(keys, jax.devices(), 10)
  assert batch["image"].shape == (32, 24, 2 * 2 * 3)
  assert batch["grid"].shape == (32, 2)
  program.train_step.lower(program.state_shapes, batch).compile()
