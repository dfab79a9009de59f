"""Fine-tuning: init_from any checkpoint, Polyak averaging, export."""

import collections
import os

import flax
import flax.linen as nn
import jax
import numpy as np
import pytest
import tensorflow as tf

from tests.test_evaluators import run_evaluators
from tests.util import (
  SMALL,
  assert_trees_equal,
  call_tool,
  latest_checkpoint,
  made_once,
  metric_rows,
  program_of,
  run_tool,
  run_training,
  small_config,
  typed,
)
from vit_jax import models, sharding
from vit_jax.data import pipeline, sources
from vit_jax.runs import checkpoints as checkpoints_lib
from vit_jax.training import resolve, step as step_lib
from vit_jax.weights import adaptation, npz as npz_lib, pretrained

POSEMB = "Transformer/posembed_input/pos_embedding"


def flat(tree):
  return flax.traverse_util.flatten_dict(
      jax.device_get(tree), sep="/")


@pytest.fixture(scope="module")
def pretrained_run(digits_data_dir, tmp_path_factory):
  """A digits run at 8x8 with a pre-logits layer, and its export (once for
  both pytest workers)."""
  config = small_config(digits_data_dir, **{"model.representation_size": 32})

  def make(workdir):
    run_training(config, workdir)
    run_tool("export", f"--workdir={workdir}",
             f"--out={os.path.join(workdir, 'exports', 'export.npz')}")
  workdir = made_once(tmp_path_factory, "finetune_pretrained", make)
  return workdir, os.path.join(workdir, "exports", "export.npz"), config


def start_of(config):
  """The state a run of `config` starts from, before any update."""
  program = program_of(config)
  return step_lib.initial_state(program, typed(config)), program


@pytest.mark.parametrize("source", ["npz", "workdir", "workdir:6"])
def test_init_from_loads_the_checkpoint_and_adapts_only_what_it_must(
    digits_data_dir, pretrained_run, source):
  workdir, npz, _ = pretrained_run
  init_from = {"npz": npz, "workdir": workdir,
               "workdir:6": workdir + ":6"}[source]
  # 16x16 images: 64 patches instead of 16; no pre-logits layer.
  config = small_config(digits_data_dir, init_from=init_from, image_size=16)
  state, _ = start_of(config)
  loaded = flat(npz_lib.load_npz(npz))
  started = flat(state.params)

  assert set(loaded) - set(started) == {"pre_logits/kernel",
                                        "pre_logits/bias"}
  for key, value in started.items():
    if key == POSEMB:
      assert value.shape == (1, 65, 32)
      np.testing.assert_array_equal(value, adaptation.resize_posemb(
          loaded[key], (1, 65, 32), num_extra=1))
    elif key.startswith("head/"):  # It sat on the dropped pre-logits.
      assert not value.any()
    else:
      np.testing.assert_array_equal(value, loaded[key], err_msg=key)


def test_an_npz_init_from_is_read_once_from_resolution_to_the_first_state(
    digits_data_dir, pretrained_run, tmp_path, monkeypatch):
  """Resolving the run learns the source's options from its arrays' headers;
  the arrays are read once, for the first state (an H/14 on GCS is
  gigabytes)."""
  _, npz, _ = pretrained_run
  reads = collections.Counter()
  read_array = npz_lib._read_array  # pylint: disable=protected-access

  def counted(npz_file, key, path):
    reads[key] += 1
    return read_array(npz_file, key, path)

  monkeypatch.setattr(npz_lib, "_read_array", counted)
  config = small_config(digits_data_dir, init_from=npz, image_size=16)
  resolved = resolve.run(config, str(tmp_path / "run"))
  assert not reads
  start_of(resolved.settings)
  assert reads.keys() == flat(npz_lib.read_shapes(npz)).keys()
  assert set(reads.values()) == {1}


@pytest.mark.parametrize("scanned", [False, True])
def test_an_npz_sources_options_from_its_headers_are_its_arrays(tmp_path,
                                                                scanned):
  model = models.create("Ti/4", 10, hidden_size=32, num_layers=2, mlp_dim=64,
                        num_heads=4, classifier="gap", num_registers=2,
                        layer_scale=0.1, qk_norm=True, final_norm="pooled",
                        mlp="swiglu")
  params = flat(model.init(jax.random.key(0), np.zeros((1, 8, 8, 3)),
                           train=False)["params"])
  params = jax.tree.map(np.asarray, nn.meta.unbox(params))
  if scanned:
    params = npz_lib.scan_blocks(params)
  path = str(tmp_path / "source.npz")
  np.savez(path, **params)
  loaded = pretrained.load(path)
  arrays = flat(loaded.params)
  from_arrays = {**loaded.function, **models.architecture_of(arrays),
                 "posemb": models.posemb_of(arrays, loaded.function)}
  assert pretrained.source_options(path) == from_arrays
  # The defaults of every option a source fixes, but the model's own.
  assert from_arrays == {
      **models.SOURCE_OPTIONS, "final_norm": "pooled", "classifier": "gap",
      "num_registers": 2, "layer_scale": 1.0, "qk_norm": True,
      "mlp": "swiglu"}


def test_scanned_and_rematerialised_runs_exchange_params_with_plain_ones(
    digits_data_dir, pretrained_run, tmp_path):
  """A scanned model starts from a plain run's export, and a plain model
  from a scanned run's workdir: each gets the same values, per layer."""
  _, npz, _ = pretrained_run
  scan = {"model.scan_layers": True, "model.remat_policy": "nothing_saveable"}
  config = small_config(digits_data_dir, init_from=npz, **scan)
  state, _ = start_of(config)
  stacked = flat(state.params)
  assert stacked["Transformer/encoderblock/MlpBlock_3/Dense_0/kernel"].shape \
      == (2, 32, 64)
  loaded = flat(npz_lib.load_npz(npz))
  for key, value in npz_lib.unscan_blocks(stacked).items():
    if not key.startswith(("head/", "pre_logits/")):
      np.testing.assert_array_equal(value, loaded[key], err_msg=key)

  workdir = str(tmp_path / "scanned")
  run_training(small_config(digits_data_dir, **scan), workdir)
  _, trained, _ = latest_checkpoint(workdir, small_config(digits_data_dir,
                                                          **scan))
  plain, _ = start_of(small_config(digits_data_dir, init_from=workdir))
  expected = npz_lib.unscan_blocks(flat(trained))
  for key, value in flat(plain.params).items():
    np.testing.assert_array_equal(value, expected[key], err_msg=key)


def test_a_checkpoint_that_does_not_fit_is_named_before_compiling(
    digits_data_dir, pretrained_run, tmp_path):
  _, npz, _ = pretrained_run
  config = small_config(digits_data_dir, init_from=npz,
                        **{"model.hidden_size": 48})
  from tests.test_train import compiles_during  # pylint: disable=g-import-not-at-top
  compiles, error = compiles_during(
      lambda: run_training(config, str(tmp_path)))
  assert "has shape (32,) in the checkpoint but the model wants (48,)" in error
  assert npz in error
  assert not compiles
  assert not os.path.exists(tmp_path / "config.json")


def test_a_resumed_fine_tune_reads_its_own_checkpoint_not_init_from(
    digits_data_dir, pretrained_run, tmp_path):
  _, npz, _ = pretrained_run
  source = str(tmp_path / "source.npz")
  npz_lib.save_npz(npz_lib.load_npz(npz), source)
  config = small_config(digits_data_dir, init_from=source, total_steps=3)
  run_training(config, str(tmp_path / "run"))
  os.remove(source)  # Reading it again would fail.
  longer = small_config(digits_data_dir, init_from=source, total_steps=6)
  run_training(longer, str(tmp_path / "run"))
  step, _, _ = latest_checkpoint(str(tmp_path / "run"), longer)
  assert step == 6


def test_polyak_average_follows_the_recurrence(digits_data_dir):
  decay = 0.8
  config = small_config(digits_data_dir, polyak_decay=decay)
  state, program = start_of(config)
  batches = pipeline.train_dataset(sources.lookup("digits", digits_data_dir),
                                   "train",
                                   batch_size=config.batch_size,
                                   image_size=8).as_numpy_iterator()
  expected = jax.tree.map(lambda p: np.asarray(p, np.float64),
                          jax.device_get(state.params))
  np.testing.assert_array_equal(flat(state.polyak)[POSEMB],
                                flat(state.params)[POSEMB])
  for _ in range(4):
    state, _ = program.train_step(
        state, sharding.to_global(next(batches), program.batch_sharding))
    expected = jax.tree.map(lambda a, p: decay * a + (1 - decay) * p,
                            expected, jax.device_get(state.params))
  average = jax.device_get(state.polyak)
  jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5,
                                                       atol=1e-7),
               average, expected)
  # It is a real average: not the params themselves.
  assert not np.allclose(flat(average)[POSEMB], flat(state.params)[POSEMB])


def test_export_of_a_step_with_no_checkpoint_names_the_steps_there(
    pretrained_run, tmp_path):
  """Not "holds no run": the run is there, the step is not."""
  workdir, _, _ = pretrained_run
  out = tmp_path / "out.npz"
  status, stdout, stderr = call_tool("export", f"--workdir={workdir}",
                                     "--step=4", f"--out={out}")
  steps = ", ".join(str(s) for s in sorted(
      int(name) for name in os.listdir(os.path.join(workdir, "checkpoints"))
      if name.isdigit()))
  assert (status, stdout) == (2, ""), stderr[-3000:]
  assert stderr == (f"error: {workdir} has no checkpoint of step 4; its "
                    f"checkpoints are of steps {steps}\n")
  assert steps and not out.exists()


def test_export_writes_the_polyak_average_and_gives_the_same_logits(
    digits_data_dir, tmp_path):
  config = small_config(digits_data_dir, polyak_decay=0.5)
  workdir = str(tmp_path / "run")
  run_training(config, workdir)
  npz = str(tmp_path / "exported.npz")
  stdout = run_tool("export", f"--workdir={workdir}", "--step=6",
                    f"--out={npz}")
  assert "Polyak average" in stdout

  program = program_of(config)
  manager = checkpoints_lib.manager(os.path.join(workdir, "checkpoints"), 3)
  state, _ = checkpoints_lib.restore_newest_whole(manager, program.state_shapes)
  exported = npz_lib.load_npz(npz)
  assert_trees_equal(exported, jax.device_get(state.polyak))
  images = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 3))
  logits = program.model.apply({"params": exported}, images, train=False)
  expected = program.model.apply({"params": jax.device_get(state.polyak)},
                                 images, train=False)
  np.testing.assert_array_equal(logits, expected)


def test_export_converts_any_readable_npz_to_the_release_layout(tmp_path):
  rng = np.random.default_rng(0)
  big_vision = {"params/pos_embedding": rng.normal(size=(1, 5, 8)),
                "params/Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel":
                rng.normal(size=(8, 16))}
  source = str(tmp_path / "bv.npz")
  np.savez(source, **big_vision)
  out = str(tmp_path / "release.npz")
  run_tool("export", f"--from={source}", f"--out={out}")
  with np.load(out) as release:
    assert sorted(release.files) == [
        "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel", POSEMB]


def test_pretrained_source_names_parse():
  assert pretrained.parse_source("runs/a") == ("runs/a", None)
  assert pretrained.parse_source("gs://b/runs/a:1200") == ("gs://b/runs/a",
                                                           1200)
  assert pretrained.parse_source("b16.npz") == ("b16.npz", None)


def test_a_folder_of_png_and_jpeg_images_fine_tunes(digits_data_dir,
                                                    pretrained_run, tmp_path):
  """The one-command case: a released-layout .npz, a folder of the user's
  images, a new resolution and class count."""
  _, npz, _ = pretrained_run
  rng = np.random.default_rng(0)
  # Three classes told apart by colour, under noise; sizes vary.
  colours = {"red": (200, 40, 40), "green": (40, 200, 40),
             "blue": (40, 40, 200)}
  for name, rgb in colours.items():
    os.makedirs(tmp_path / "images" / name)
    for i in range(30):
      size = tuple(rng.integers(12, 40, 2))
      pixels = np.clip(rng.normal(rgb, 40, size + (3,)), 0, 255).astype(
          np.uint8)
      if i % 2:
        file_name, encoded = f"{i}.png", tf.io.encode_png(pixels)
      else:
        file_name, encoded = f"{i}.JPG", tf.io.encode_jpeg(pixels, quality=90)
      with open(tmp_path / "images" / name / file_name, "wb") as f:
        f.write(encoded.numpy())
  config = small_config(digits_data_dir,
                        init_from=npz,
                        dataset=f"folder:{tmp_path / 'images'}",
                        train_split="train[:80%]",
                        image_size=16,
                        augment="random_crop,flip",
                        total_steps=30,
                        checkpoint_every=30,
                        **{
                            "evaluators.test.split": "train[80%:]",
                            "evaluators.test.every": 30,
                            "optimizer.name": "sgd",
                            "optimizer.learning_rate": 0.03,
                            "optimizer.weight_decay": 0.0,
                            "batch_size": 24
                        })
  result = run_training(config, str(tmp_path / "run"))
  assert result["test_accuracy"] >= 0.9



def short_transfer(digits_data_dir, arg, **overrides):
  """configs/digits_transfer.py's `arg`, shortened to 20 steps of the
  tests' small model (compiling the configs' 4-layer one twice was most of
  the chain's time)."""
  from configs import digits_transfer  # pylint: disable=g-import-not-at-top
  model = {k: v for k, v in SMALL.items() if k.startswith("model.")}
  config = digits_transfer.get_config(arg)
  config.update_from_flattened_dict(
      {"data_dir": digits_data_dir, "total_steps": 20,
       "optimizer.warmup_steps": 2, **model, **overrides})
  return config


@pytest.fixture(scope="module")
def transfer_chain(digits_data_dir, tmp_path_factory):
  """The shortened fine-tune's test accuracy: pretrain on digits 0-4 for 200 steps, then fine-tune from it on 5-9 for
  20 (a fresh head: the source's dataset is another); once for both pytest
  workers."""
  def make(root):
    run_training(short_transfer(digits_data_dir, "pretrain", total_steps=200,
                                checkpoint_every=200,
                                **{"evaluators.test.every": 200}),
                 os.path.join(root, "pretrain"))
    run_training(short_transfer(digits_data_dir, "finetune",
                                init_from=os.path.join(root, "pretrain")),
                 os.path.join(root, "finetune"))
  root = made_once(tmp_path_factory, "transfer_chain", make)
  accuracy = [row["test_accuracy"] for row in
              metric_rows(os.path.join(root, "finetune"))
              if "test_accuracy" in row][-1]
  return accuracy


def test_the_transfer_configs_chain(transfer_chain):
  """configs/digits_transfer.py, shortened: pretrain feeds finetune."""
  from configs import digits_transfer  # pylint: disable=g-import-not-at-top
  accuracy = transfer_chain
  assert accuracy > 0.4  # Twice chance, of 5 classes.
  # "scratch" trains the fine-tune's model and budget from random weights
  # (its training is what every other digits test does).
  scratch = digits_transfer.get_config("scratch")
  as_given = digits_transfer.get_config("finetune")
  assert not scratch.init_from and as_given.image_size == 16
  for key in ("dataset", "image_size", "total_steps", "batch_size",
              "model.name", "model.hidden_size", "model.num_layers"):
    assert scratch[key] == as_given[key], key
  with pytest.raises(ValueError, match="pretrain, finetune or scratch"):
    digits_transfer.get_config("finetuning")


def test_fine_tuning_beats_training_from_scratch(digits_data_dir,
                                                 transfer_chain, tmp_path):
  """The point of `make transfer` (docs/training.md: 0.972 against 0.767
  and 0.833 at 100 steps, two seeds), in 20: what pre-training on 0-4
  learned helps on 5-9."""
  tuned = transfer_chain
  scratch = run_training(short_transfer(digits_data_dir, "scratch"),
                         str(tmp_path))["test_accuracy"]
  assert tuned > 0.5  # Of 5 classes: chance is 0.2.
  assert tuned > scratch + 0.1


def test_init_from_with_polyak_trains(digits_data_dir, pretrained_run,
                                      tmp_path):
  """The average starts at the loaded params but in buffers of its own (the
  step donates the state: a shared buffer would be donated twice)."""
  _, npz, _ = pretrained_run
  config = small_config(digits_data_dir, init_from=npz, polyak_decay=0.5,
                        total_steps=3)
  result = run_training(config, str(tmp_path))
  program = program_of(config)
  manager = checkpoints_lib.manager(os.path.join(tmp_path, "checkpoints"), 3)
  state, _ = checkpoints_lib.restore_newest_whole(manager, program.state_shapes)
  assert int(state.step) == 3
  # What the run reports is the average's accuracy, as scored again here.
  _, _, scored = run_evaluators(config, jax.device_get(state.polyak))
  assert result["test_accuracy"] == scored["test_accuracy"]
  assert not np.allclose(flat(state.polyak)[POSEMB], flat(state.params)[POSEMB])
