"""configs/table2: the paper's numbers; every config checked and its model
built at full size; two steps of a few, shrunk.

The expected values below are typed from docs/paper.md (Tables 2, 3, 4), not
read from the configs. The datasets cannot be downloaded here, so
`tfds.testing.mock_data` serves random examples, with split metadata written
the way a prepared dataset has it (DATA_DIR/<name>/<version>/
dataset_info.json and features.json): pipeline_lib.get_builder then takes
them as prepared, unpatched. Each two-step run costs 15-40 s of CPU (XLA
compiles and the checkpoint, whatever the model size), so three configs run
(JFT pre-training, ImageNet-21k pre-training and the ImageNet fine-tune that
starts from it) and a short fine-tune (Pets); all the others are checked and
built at full size without compiling.
"""

import math
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from configs import digits
from configs.table2 import finetune, pretrain
from tests.test_train import compiles_during
from tests.util import (
  SMALL,
  check_config,
  mocked_tfds,
  program_of,
  run_training,
)
from vit_jax import errors, models
from vit_jax.data import sources
from vit_jax.models import flops
from vit_jax.runs import settings

# Table 3 (Section 4.1) and Table 1's widths, for Table 2's three columns.
PRETRAIN = {
    "H/14,jft": dict(epochs=14, lr=3e-4, weight_decay=0.1, dropout=0.0,
                     images=303e6, width=1280, dataset="jft300m"),
    "L/16,jft": dict(epochs=14, lr=4e-4, weight_decay=0.1, dropout=0.0,
                     images=303e6, width=1024, dataset="jft300m"),
    "L/16,i21k": dict(epochs=90, lr=1e-3, weight_decay=0.03, dropout=0.1,
                      images=14e6, width=1024, dataset="imagenet21k"),
}
# ceil(epochs * images / 4096), worked out by hand.
PRETRAIN_STEPS = {"H/14,jft": 1_035_645, "L/16,jft": 1_035_645,
                  "L/16,i21k": 307_618}
# The other rows of Table 3 that pretrain.py also takes: (epochs, lr).
OTHER_PRETRAIN = {"B/16,jft": (7, 8e-4), "B/32,jft": (7, 8e-4),
                  "L/32,jft": (7, 6e-4), "B/16,i21k": (90, 1e-3),
                  "B/32,i21k": (90, 1e-3), "L/32,i21k": (90, 1e-3)}
# Table 2: TPUv3-core-days of pre-training.
CORE_DAYS = {"H/14,jft": 2500, "L/16,jft": 680, "L/16,i21k": 230}

COLUMNS = ("H/14-jft", "L/16-jft", "L/16-i21k")
# Table 2's rows -> (TFDS name, its test split, Table 4's steps, lr sweep).
SWEEP = (0.001, 0.003, 0.01, 0.03)
ROWS = {
    "imagenet": ("imagenet2012", "validation", 20_000,
                 (0.003, 0.01, 0.03, 0.06)),
    "real": ("imagenet2012", "validation", 20_000,
             (0.003, 0.01, 0.03, 0.06)),
    "cifar10": ("cifar10", "test", 10_000, SWEEP),
    "cifar100": ("cifar100", "test", 10_000, SWEEP),
    "pets": ("oxford_iiit_pet", "test", 500, SWEEP),
    "flowers": ("oxford_flowers102", "test", 500, SWEEP),
}
FINETUNES = [f"{column},{row}" for column in COLUMNS for row in ROWS]
ALL = ([f"pretrain:{a}" for a in PRETRAIN]
       + [f"finetune:{a}" for a in FINETUNES])

# Split sizes of the mock metadata: the real ones (TFDS catalog), and the
# paper's figures for the two pre-training sets.
SPLITS = {
    "cifar10": {"train": 50_000, "test": 10_000},
    "cifar100": {"train": 50_000, "test": 10_000},
    "imagenet2012": {"train": 1_281_167, "validation": 50_000,
                     "test": 100_000},
    "oxford_iiit_pet": {"train": 3_680, "test": 3_669},
    "oxford_flowers102": {"train": 1_020, "validation": 1_020,
                          "test": 6_149},
    "imagenet2012_real": {"validation": 50_000},
    "imagenet_v2": {"test": 10_000},
}
# Not in the catalog: (train images, classes). JFT-300M has 18,291 classes,
# big_vision's ImageNet-21k 21,843.
PRIVATE = {"jft300m": (303_000_000, 18_291),
           "imagenet21k": (14_000_000, 21_843)}

# A model small enough for two steps on CPU: the sizes that a name sets
# (but its patch size), as the tests' small runs have them.
TINY_MODEL = {key: SMALL[f"model.{key}"] for key in models.VARIANTS["B"]}

# The optimizer's keys of Muon and warmup-stable-decay, at their defaults
# in the configs that predate them.
MUON_AND_WSD = dict(
    wsd_fraction=0.2, wsd_shape="1-sqrt", adam_learning_rate=None,
    muon_beta=0.95, muon_per_head=False, muon_consistent_rms=0.2,
    muon_adaptive=False, muon_preconditioning="frobenius")


def get(name):
  """"pretrain:L/16,jft" or "finetune:L/16-i21k,cifar10" -> its config."""
  file, _, arg = name.partition(":")
  return {"pretrain": pretrain, "finetune": finetune}[file].get_config(arg)


def _split_dict(sizes):
  return tfds.core.SplitDict([
      tfds.core.SplitInfo(name=name, shard_lengths=[size], num_bytes=0,
                          filename_template=None)
      for name, size in sizes.items()])


def write_metadata(data_dir):
  """What a prepared dataset has besides its records, for every dataset."""
  for name, sizes in SPLITS.items():
    builder = tfds.builder(name, data_dir=data_dir)
    builder.info.set_splits(_split_dict(sizes))
    os.makedirs(builder.data_path, exist_ok=True)
    builder.info.write_to_directory(builder.data_path)
  for name, (size, num_classes) in PRIVATE.items():
    write_private_metadata(data_dir, name, size, num_classes)


def write_private_metadata(data_dir, name, size, num_classes):
  path = os.path.join(data_dir, name, "1.0.0")
  info = tfds.core.DatasetInfo(
      builder=tfds.core.DatasetIdentity(
          name=name, version=tfds.core.Version("1.0.0"), data_dir=path,
          module_name=__name__),
      features=tfds.features.FeaturesDict({
          "image": tfds.features.Image(shape=(None, None, 3)),
          "label": tfds.features.ClassLabel(num_classes=num_classes)}))
  info.set_splits(_split_dict({"train": size}))
  os.makedirs(path, exist_ok=True)
  info.write_to_directory(path)


@pytest.fixture(scope="module")
def metadata_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("table2_metadata"))
  write_metadata(data_dir)
  return data_dir


def fake_records(builder, split, decoders=None, **_):
  """16 random examples per share of any split, as the input pipeline reads
  records: PNG bytes of 20 to 60 pixels a side (its SkipDecoding) and a
  label. (mock_data's own generator makes every feature, and fails on
  oxford_iiit_pet's bounding boxes, drawing ymin > ymax.)"""
  del split, decoders
  rng = np.random.default_rng(0)
  images = [tf.io.encode_png(rng.integers(
      0, 256, (*rng.integers(20, 61, 2), 3), dtype=np.uint8)).numpy()
            for _ in range(16)]
  if builder.name == "imagenet2012_real":  # A set of 0 to 2 labels each.
    return tf.data.Dataset.from_tensor_slices({
        "image": images, "original_label": np.arange(16),
        "real_label": tf.ragged.constant([[i, 2 * i][:i % 3] for i in
                                          range(16)], dtype=tf.int64)})
  num_classes = builder.info.features["label"].num_classes
  labels = np.arange(16) % num_classes  # Some classes of each, for few-shot.
  return tf.data.Dataset.from_tensor_slices({"image": images,
                                             "label": labels})


@pytest.fixture
def mock_tfds(metadata_dir):
  """Random examples for every dataset, with the metadata's splits."""
  with mocked_tfds(metadata_dir, fake_records):
    yield


def shrunk(config, image_size):
  """`config` as a two-step run of a tiny model on 8 devices."""
  config.model.update(TINY_MODEL)
  if config.model.representation_size is not None:
    config.model.representation_size = TINY_MODEL["hidden_size"]
  config.image_size = image_size
  config.batch_size = 16
  config.total_steps = 2
  config.optimizer.warmup_steps = 1
  config.log_every = 1
  config.checkpoint_every = 2
  for evaluator in config.evaluators.values():
    evaluator.every = 2
  if "fewshot" in config.evaluators:
    # What 16 random examples per share can fill; small splits, for the
    # padding of every share is as long as the metadata's sizes say.
    fewshot = config.evaluators.fewshot
    fewshot.update(shots=(1, 5), heldout_per_class=2)
    for dataset, (pool, test) in fewshot.datasets.items():
      fewshot.datasets[dataset] = (f"{pool.split('+')[0]}[:128]",
                                   f"{test}[:16]")
  # Scanned (and rematerialised) as configured, but data parallel: FSDP's
  # gathers cost emulated devices seconds per run (tests/test_sharding.py
  # and test_train.py cover it).
  config.mesh.update(data=8, fsdp=1, model=1)
  return config


def flat_keys(config):
  """Dotted keys, but for the evaluators, which each config names."""
  def walk(d, prefix):
    for key, value in d.items():
      if isinstance(value, dict):
        yield from walk(value, prefix + key + ".")
      else:
        yield prefix + key
  return {key for key in walk(config.to_dict(), "")
          if not key.startswith("evaluators.")}


# --- The numbers -------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_keys_are_those_of_digits_with_the_names_model_sizes(name):
  config = get(name)
  assert flat_keys(config) == flat_keys(digits.get_config())
  assert [config.model[key] for key in TINY_MODEL] == [None] * len(TINY_MODEL)


@pytest.mark.parametrize("arg", PRETRAIN)
def test_pretrain_is_table3(arg):
  expected = PRETRAIN[arg]
  config = pretrain.get_config(arg)
  model_name = arg.split(",")[0]
  assert config.dataset == expected["dataset"]
  assert config.batch_size == 4096 and config.accum_steps == 1
  assert config.image_size == 224
  assert config.total_steps == PRETRAIN_STEPS[arg] == math.ceil(
      expected["epochs"] * expected["images"] / 4096)
  assert config.augment == "inception_crop,flip"
  assert config.polyak_decay == 0.0 and config.init_from == ""
  assert config.optimizer.to_dict() | {"momentum": None} == dict(
      name="adam", learning_rate=expected["lr"], warmup_steps=10_000,
      decay="linear", weight_decay=expected["weight_decay"],
      weight_decay_end=None, **MUON_AND_WSD,
      grad_clip_norm=0.0, b1=0.9, b2=0.999, mu_dtype="float32", momentum=None,
      layer_decay=1.0, lr_mults=(), frozen="")
  # Every other key of config.model at its default.
  assert config.model.to_dict() == settings.defaults().model.to_dict() | dict(
      name=model_name, representation_size=expected["width"],
      dropout_rate=expected["dropout"], dtype="bfloat16", scan_layers=True)
  variant = models.VARIANTS[model_name[0]]
  assert config.model.representation_size == variant["hidden_size"]
  assert config.mesh.to_dict() == dict(data=-1, fsdp=8, model=1, slices=-1,
                                       fsdp_min_bytes=0)
  # The held-out images are not trained on.
  assert config.train_split == "train[51200:]"
  assert config.evaluators.val.to_dict() == dict(
      kind="accuracy", every=10_000, split="train[:51200]")
  # Few-shot linear probes of Table 2's downstream datasets (Section 4.1).
  assert config.evaluators.fewshot.kind == "fewshot"
  assert config.evaluators.fewshot.datasets.to_dict() == {
      "imagenet2012": ("train", "validation"), "cifar10": ("train", "test"),
      "cifar100": ("train", "test"), "oxford_iiit_pet": ("train", "test"),
      "oxford_flowers102": ("train+validation", "test")}


@pytest.mark.parametrize("arg", OTHER_PRETRAIN)
def test_other_table3_rows(arg):
  epochs, lr = OTHER_PRETRAIN[arg]
  config = pretrain.get_config(arg)
  images = 303e6 if arg.endswith("jft") else 14e6
  assert config.total_steps == math.ceil(epochs * images / 4096)
  assert config.optimizer.learning_rate == lr
  assert config.model.dropout_rate == (0.0 if arg.endswith("jft") else 0.1)


def test_epochs_chosen_are_those_table2s_core_days_imply():
  # Pre-training cost ~ FLOPs per image x images, at one speed per FLOP:
  # predict each L/16 column from H/14's 2.5k core-days, for both epoch
  # counts Table 3 allows, and check the config took the nearer (in ratio).
  def cost(arg, epochs):
    model = arg.split(",")[0]
    return flops.flops_per_image(model, 224) * epochs * PRETRAIN[arg]["images"]

  per_cost = CORE_DAYS["H/14,jft"] / cost("H/14,jft", 14)
  for arg, choices in (("L/16,jft", (7, 14)), ("L/16,i21k", (30, 90))):
    nearest = min(choices, key=lambda e: abs(math.log(
        per_cost * cost(arg, e) / CORE_DAYS[arg])))
    assert pretrain.get_config(arg).total_steps == math.ceil(
        nearest * PRETRAIN[arg]["images"] / 4096), arg
  # And the two L/16 configs agree with each other as Table 2's columns do:
  # at one speed per FLOP, the FLOPs each config trains (its steps, batch,
  # model and resolution, as configured) make JFT's 0.68k core-days 0.20k
  # for ImageNet-21k, against Table 2's 0.23k.
  def trained_flops(arg):
    keys = settings.of(pretrain.get_config(arg))
    return keys.total_steps * keys.batch_size * flops.flops_per_image(
        keys.model, keys.image_size, train=True)

  i21k = CORE_DAYS["L/16,jft"] * (trained_flops("L/16,i21k")
                                  / trained_flops("L/16,jft"))
  assert i21k == pytest.approx(CORE_DAYS["L/16,i21k"], rel=0.15)


@pytest.mark.parametrize("arg", FINETUNES)
def test_finetune_is_table4(arg):
  column, row = arg.split(",")
  model_name, source = column.split("-")
  dataset, test_split, steps, sweep = ROWS[row]
  config = finetune.get_config(arg)
  on_imagenet = dataset == "imagenet2012"
  assert config.dataset == dataset
  assert config.batch_size == 512 and config.accum_steps == 1
  if on_imagenet:
    assert config.image_size == {"L/16": 512, "H/14": 518}[model_name]
  else:  # 384, or the patch grid it has (27x27 for H/14: 378).
    patch = int(model_name.split("/")[1])
    assert config.image_size == 384 // patch * patch
  assert config.polyak_decay == (0.9999 if on_imagenet else 0.0)
  assert config.total_steps == steps
  assert config.augment == "random_crop,flip"
  assert config.eval_crop_fraction == 1.0
  opt = config.optimizer
  assert (opt.name, opt.decay, opt.weight_decay, opt.grad_clip_norm,
          opt.momentum) == ("sgd", "cosine", 0.0, 1.0, 0.9)
  assert opt.learning_rate in sweep
  assert 0 < opt.warmup_steps <= steps // 5
  assert config.model.to_dict() == settings.defaults().model.to_dict() | dict(
      name=model_name, dtype="bfloat16",
      remat_policy="dots_with_no_batch_dims_saveable", scan_layers=True)
  assert config.mesh.to_dict() == dict(data=-1, fsdp=8, model=1, slices=-1,
                                       fsdp_min_bytes=0)
  # 2% of the train split held out: the minival that picks the lr.
  assert config.train_split == "train[:98%]"
  assert config.evaluators.to_dict() == {"minival": dict(
      kind="accuracy", every=steps // 10, split="train[98%:]")}
  if source == "i21k":
    assert config.init_from == "gs://vit_models/imagenet21k/ViT-L_16.npz"
  else:  # A placeholder that names the way out, and no file.
    assert f"pretrain.py:{model_name},jft" in config.init_from
    assert config.init_from.endswith(".npz")
    assert not os.path.exists(config.init_from)

  for extra in ("test", "0.01,test", "test,0.01"):
    on_test = finetune.get_config(f"{arg},{extra}")
    assert on_test.train_split == "train"
    assert on_test.evaluators.test.to_dict() == dict(
        kind="accuracy", every=steps // 10, split=test_split)
    # ImageNet's validation images scored against ReaL's label sets too.
    assert ("real" in on_test.evaluators) == on_imagenet
    if on_imagenet:
      assert on_test.evaluators.real.to_dict() == dict(
          kind="real", every=steps // 10, dataset="imagenet2012_real",
          split="validation")
    assert on_test.optimizer.learning_rate == (
        0.01 if "0.01" in extra else opt.learning_rate)
  for lr in sweep:
    assert finetune.get_config(f"{arg},{lr}").optimizer.learning_rate == lr


@pytest.mark.parametrize("column", COLUMNS)
def test_real_is_the_imagenet_finetune(column):
  assert (finetune.get_config(f"{column},real").to_dict()
          == finetune.get_config(f"{column},imagenet").to_dict())


def test_finetune_datasets_are_in_the_tfds_catalog():
  # ReaL's label sets too, which the ImageNet fine-tune's `real` evaluator
  # reads.
  for dataset in {row[0] for row in ROWS.values()} | {"imagenet2012_real"}:
    builder = tfds.builder_cls(dataset)  # DatasetNotFoundError if not.
    assert issubclass(builder, tfds.core.DatasetBuilder), dataset
    assert builder.name == dataset


@pytest.mark.parametrize("module,arg,message", [
    (pretrain, None, "MODEL,DATA[,TFDS_NAME]"),
    (pretrain, "H/14,i21k", "H/14,i21k is no row of Table 3"),
    (pretrain, "L/16,jft,a,b", "L/16,jft, H/14,jft"),
    (finetune, "L/16,cifar10", "H/14-jft, L/16-jft, L/16-i21k"),
    (finetune, "L/16-i21k,svhn", "imagenet, cifar10, cifar100, pets, "
     "flowers, real"),
    (finetune, "L/16-i21k,cifar10,fast", "'fast' is neither a learning rate"),
    (finetune, "L/16-i21k,cifar10,-0.1", "must be positive"),
])
def test_bad_arguments_show_the_usage(module, arg, message):
  with pytest.raises(ValueError, match="takes") as error:
    module.get_config(arg)
  assert message in str(error.value)


# --- Wiring: full size built, tiny size run ---------------------------------


@pytest.mark.parametrize("name", ALL)
def test_full_size_config_passes_its_checks(mock_tfds, name):
  """Batch, mesh, patch and image size, splits (real sizes): all fit."""
  config = get(name)
  check_config(config)


# One per model shape: (model, image size, pre-logits, Polyak).
SHAPES = ["pretrain:H/14,jft", "pretrain:L/16,jft", "pretrain:L/16,i21k",
          "finetune:H/14-jft,imagenet", "finetune:H/14-jft,cifar10",
          "finetune:L/16-jft,imagenet", "finetune:L/16-i21k,cifar100"]


@pytest.mark.parametrize("name", SHAPES)
def test_full_size_model_builds(mock_tfds, name):
  """The real model and train state, traced but neither allocated nor
  compiled."""
  config = get(name)
  num_classes = sources.lookup(config.dataset, None).num_classes
  program = program_of(config, num_classes)
  patch = int(config.model.name.split("/")[1])
  width = models.VARIANTS[config.model.name[0]]["hidden_size"]
  params = program.state_shapes.params
  assert params["Transformer"]["posembed_input"]["pos_embedding"].shape == (
      1, (config.image_size // patch)**2 + 1, width)
  assert params["head"]["kernel"].shape == (
      config.model.representation_size or width, num_classes)
  assert ("pre_logits" in params) == (name.startswith("pretrain:"))
  assert (program.state_shapes.polyak is None) == (config.polyak_decay == 0)


def small_split(split):
  """64 examples of the split (of its first part): evaluating a whole
  held-out split, as large as its metadata says, would be thousands of
  padded batches of 16."""
  return split.split("[")[0].split("+")[0] + "[:64]"


def run_two_steps(name, workdir, image_patches=2, **overrides):
  """Two steps of `name` with a tiny model on images of image_patches^2
  patches, on random examples, every evaluator included; returns its
  config."""
  config = get(name)
  patch = int(config.model.name.split("/")[1])
  shrunk(config, image_size=image_patches * patch)
  for evaluator in config.evaluators.values():
    if "split" in evaluator:
      evaluator.split = small_split(evaluator.split)
  config.update_from_flattened_dict(overrides)
  result = run_training(config, str(workdir))
  for evaluator in config.evaluators:
    # Accuracies; the counts of examples scored aside.
    scores = [v for k, v in result.items()
              if k.startswith(evaluator) and not k.endswith("examples")]
    assert scores and all(0.0 <= v <= 1.0 for v in scores), evaluator
  assert os.path.exists(os.path.join(workdir, "checkpoints", "2"))
  return config, result


def test_imagenet_finetune_starts_from_an_i21k_pretrain_run(
    mock_tfds, tmp_path):
  """L/16 pre-trained on ImageNet-21k (2x2 patches, pre-logits) feeds the
  ImageNet fine-tune (3x3 patches, no pre-logits, Polyak) via init_from,
  scored on the validation split and its ReaL labels."""
  upstream = tmp_path / "pretrain"
  run_two_steps("pretrain:L/16,i21k", upstream)
  config, result = run_two_steps("finetune:L/16-i21k,imagenet,test",
                                 tmp_path / "finetune", image_patches=3,
                                 init_from=str(upstream))
  assert config.polyak_decay == 0.9999
  assert {"test_accuracy", "real_accuracy"} <= set(result)


# Each pre-training dataset, each fine-tuning row and each column of Table 2
# run once more, from scratch (the JFT models are not public; loading is the
# test above's). A config's row sets its data, splits and evaluators and its
# column the model, so every pairing need not run: all of them pass the
# full-size checks above, and L/16 pre-trains and fine-tunes on ImageNet
# above.
OTHER_RUNS = ["pretrain:H/14,jft",
              "finetune:H/14-jft,pets", "finetune:L/16-jft,cifar10",
              "finetune:L/16-jft,flowers", "finetune:L/16-i21k,cifar100"]


@pytest.mark.parametrize("name", OTHER_RUNS)
def test_two_steps(mock_tfds, tmp_path, name):
  _, result = run_two_steps(name, tmp_path, init_from="")
  if name.startswith("pretrain:"):  # cifar10's classes fill 1 and 5 shots.
    assert {"fewshot/cifar10_1shot", "fewshot/cifar10_5shot"} <= set(result)


def test_jft_finetune_placeholder_stops_before_compiling(mock_tfds, tmp_path):
  config = shrunk(finetune.get_config("H/14-jft,cifar10"), image_size=28)
  compiles, error = compiles_during(
      lambda: run_training(config, str(tmp_path)))
  assert "config.init_from=" in error
  assert "pretrain.py:H/14,jft" in error
  assert not compiles
  assert not os.path.exists(tmp_path / "config.json")


def test_jft_is_read_from_prepared_files(tmp_path):
  """No mock: the metadata of a prepared DATA_DIR/jft300m/1.0.0 is all
  the config's check reads (training would read the records beside it)."""
  write_private_metadata(str(tmp_path), "jft300m", *PRIVATE["jft300m"])
  config = pretrain.get_config("H/14,jft")
  config.data_dir = str(tmp_path)
  config.evaluators.fewshot.every = 0  # Its datasets are not here.
  check_config(config)
  assert sources.lookup("jft300m", str(tmp_path)).num_classes == 18_291
  assert pretrain.get_config("H/14,jft,jft_v2").dataset == "jft_v2"


def jft_error(tmp_path):
  config = pretrain.get_config("L/16,jft")
  config.data_dir = str(tmp_path)
  with pytest.raises(errors.ConfigError) as error:
    check_config(config)
  return str(error.value)


def test_unprepared_jft_is_refused_naming_it(tmp_path):
  assert "'jft300m'" in jft_error(tmp_path)


def test_unprepared_jft_message_says_what_to_provide(tmp_path):
  message = jft_error(tmp_path)
  assert str(tmp_path) in message  # Where it looked.
  assert "jft300m/" in message and "dataset_info.json" in message  # What.
