"""configs/imagenet: the paper's ImageNet-1k pre-training and the plain ViT
baseline, their numbers typed from the papers (docs/paper.md's Table 3; the
plain baselines' report), checked at full size and run for two steps,
shrunk, on random examples (tests/test_table2.py's mock TFDS)."""

import pytest

from configs.imagenet import muon, paper, plain

# metadata_dir and mock_tfds: fixtures, which pytest finds by their names.
from tests.test_table2 import (  # noqa: F401
  MUON_AND_WSD,
  flat_keys,
  metadata_dir,
  mock_tfds,
  shrunk,
  small_split,
)
from tests.util import check_config, run_training
from vit_jax.data import sources
from vit_jax.runs import settings
from vit_jax.training import resolve
from vit_jax.weights import pretrained

# ImageNet-1k's train split less the 1% held out: TFDS rounds 1,281,167 x
# 0.99 to 1,268,355.
TRAIN_IMAGES = 1_268_355


def test_paper_is_table3s_imagenet_row():
  for model in ("B/32", "B/16", "L/32", "L/16"):
    config = paper.get_config(model)
    assert config.batch_size == 4096 and config.image_size == 224
    assert config.total_steps == 92_898  # ceil(300 * TRAIN_IMAGES / 4096)
    assert config.optimizer.to_dict() | {"momentum": None} == dict(
        name="adam", learning_rate=3e-3, warmup_steps=10_000,
        decay="cosine", weight_decay=0.3, grad_clip_norm=1.0, b1=0.9,
        weight_decay_end=None, **MUON_AND_WSD,
        b2=0.999, mu_dtype="float32", momentum=None, layer_decay=1.0,
        lr_mults=(), frozen="")
    assert config.model.dropout_rate == 0.1
    assert config.model.representation_size == {"B": 768, "L": 1024}[
        model[0]]
    # Unset: a run from scratch takes the class token.
    assert pretrained.with_source(
        settings.of(config)).model.classifier == "token"
    assert config.label_smoothing == 0.1
    assert config.mixup.prob == 0 and config.randaugment == ""


@pytest.mark.parametrize("epochs, steps", [(90, 111_477), (150, 185_795),
                                           (300, 371_589)])
def test_plain_is_the_big_vision_recipe(epochs, steps):
  for model, width in (("S/16", 384), ("B/16", 768)):
    config = plain.get_config(f"{model},{epochs}")
    assert config.total_steps == steps  # ceil(epochs * TRAIN_IMAGES / 1024)
    assert config.batch_size == 1024
    assert config.optimizer.to_dict() | {"momentum": None} == dict(
        name="adam", learning_rate=1e-3, warmup_steps=10_000,
        decay="cosine", weight_decay=0.1, grad_clip_norm=1.0, b1=0.9,
        weight_decay_end=None, **MUON_AND_WSD,
        b2=0.999, mu_dtype="float32", momentum=None, layer_decay=1.0,
        lr_mults=(), frozen="")
    assert (config.model.classifier, config.model.posemb) == ("gap",
                                                              "sincos2d")
    assert config.model.representation_size == width
    assert config.model.dropout_rate == 0.0 and config.label_smoothing == 0
    assert config.augment == "inception_crop,flip"
    assert config.randaugment == "2,10"
    assert config.mixup.to_dict() == dict(prob=1.0, alpha=0.2)
    assert config.cutmix.prob == 0


@pytest.mark.usefixtures("mock_tfds")
def test_the_split_sizes_are_tfds_own():
  source = sources.lookup("imagenet2012", None)
  assert source.num_examples("train[:99%]") == TRAIN_IMAGES
  assert source.num_examples("train[99%:]") == 1_281_167 - TRAIN_IMAGES


NAMES = ["paper:B/32", "paper:B/16", "paper:L/32", "paper:L/16",
         "plain:S/16,90", "plain:B/16,300", "muon:S/16,90", "muon:B/16,300"]


def get(name):
  file, _, arg = name.partition(":")
  return {"paper": paper, "plain": plain, "muon": muon}[file].get_config(arg)


def test_muon_is_the_plain_baseline_with_timms_muon():
  for arg in ("S/16,90", "B/16,300"):
    config, baseline = muon.get_config(arg), plain.get_config(arg)
    assert config.optimizer.to_dict() == baseline.optimizer.to_dict() | dict(
        name="muon", muon_beta=0.95, b2=0.95, muon_consistent_rms=0.2)
    config.optimizer = baseline.optimizer
    assert config == baseline  # All else the plain baseline's.
  with pytest.raises(ValueError, match="muon.py takes MODEL,EPOCHS"):
    muon.get_config("S/16")


@pytest.mark.usefixtures("mock_tfds")
@pytest.mark.parametrize("name", NAMES)
def test_full_size_config_passes_its_checks(name):
  from configs import digits  # pylint: disable=g-import-not-at-top
  config = get(name)
  assert flat_keys(config) == flat_keys(digits.get_config())
  assert [config.model[key] for key in ("hidden_size", "num_layers",
                                        "mlp_dim", "num_heads")] == [None] * 4
  check_config(config)


@pytest.mark.usefixtures("mock_tfds")
@pytest.mark.parametrize("epochs, steps", [(300, 92_898), (1200, 371_589)])
def test_distilling_is_function_matching_of_a_b16_into_an_s16(epochs, steps):
  """configs/distill/imagenet.py: big_vision's function matching (every
  batch mixed with Beta(1, 1), KL at temperature 1, no label loss, batch
  4096, Adam's first moment in bfloat16) with the plain S/16's rates; the
  student's config passes every check (the teacher, a hub name, is not in
  this machine's cache)."""
  from configs import digits  # pylint: disable=g-import-not-at-top
  from configs.distill import imagenet  # pylint: disable=g-import-not-at-top
  config = imagenet.get_config(str(epochs))
  assert flat_keys(config) == flat_keys(digits.get_config())
  assert config.total_steps == steps  # ceil(epochs * TRAIN_IMAGES / 4096)
  assert config.distill.to_dict() == dict(
      teacher="hf://google/vit-base-patch16-224", kind="soft",
      temperature=1.0, label_weight=0.0, teacher_mean=(), teacher_std=())
  assert config.mixup.to_dict() == dict(prob=1.0, alpha=1.0)
  assert config.augment == "inception_crop,flip" and not config.randaugment
  assert (config.batch_size, config.model.name) == (4096, "S/16")
  assert config.optimizer.to_dict() | {"momentum": None} == dict(
      name="adam", learning_rate=1e-3, warmup_steps=10_000,
      decay="cosine", weight_decay=0.1, grad_clip_norm=1.0, b1=0.9,
      weight_decay_end=None, **MUON_AND_WSD,
      b2=0.999, mu_dtype="bfloat16", momentum=None, layer_decay=1.0,
      lr_mults=(), frozen="")
  config.distill.teacher = ""
  check_config(config)
  with pytest.raises(ValueError, match="EPOCHS, one of 300, 1200"):
    imagenet.get_config("90")


def test_bad_arguments_show_the_usage():
  with pytest.raises(ValueError, match="MODEL, one of"):
    paper.get_config("S/16")
  with pytest.raises(ValueError, match="EPOCHS one of"):
    plain.get_config("S/16,100")


@pytest.mark.usefixtures("mock_tfds")
def test_plain_runs_two_steps_with_its_augmentations(tmp_path):
  """RandAugment, Mixup, GAP and sin-cos position embeddings, every
  evaluator (minival, validation, ReaL, v2), on a tiny model."""
  config = shrunk(get("plain:S/16,90"), image_size=32)
  for evaluator in config.evaluators.values():
    evaluator.split = small_split(evaluator.split)
  result = run_training(config, str(tmp_path))
  assert {"minival_accuracy", "val_accuracy", "real_accuracy",
          "v2_accuracy"} <= set(result)


# ceil(epochs * TRAIN_IMAGES / batch) of MAE's pre-training (4096) and
# fine-tuning (1024) batches.
MAE_STEPS = {("pretrain", 800): 247_726, ("pretrain", 1600): 495_452,
             ("warmup", 40): 12_387, ("finetune", 100): 123_863,
             ("finetune", 50): 61_932, ("finewarm", 5): 6_194,
             ("probe", 90): 6_968, ("probewarm", 10): 775}


@pytest.mark.usefixtures("mock_tfds")
@pytest.mark.parametrize("model", ["B/16", "L/16", "H/14"])
def test_mae_configs_are_the_papers(model):
  """configs/mae/imagenet.py: He et al.'s pre-training (appendix A.1),
  facebookresearch/mae's fine-tuning and its linear probe, at full size,
  passing every check."""
  from configs import digits  # pylint: disable=g-import-not-at-top
  from configs.mae import imagenet  # pylint: disable=g-import-not-at-top
  config = imagenet.get_config(f"pretrain,{model},800")
  assert flat_keys(config) == flat_keys(digits.get_config())
  assert config.objective == "mae" and config.batch_size == 4096
  assert config.total_steps == MAE_STEPS["pretrain", 800]
  assert imagenet.get_config(f"pretrain,{model},1600").total_steps == (
      MAE_STEPS["pretrain", 1600])
  assert config.optimizer.to_dict() | {"momentum": None} == dict(
      name="adam", learning_rate=pytest.approx(1.5e-4 * 4096 / 256),
      warmup_steps=MAE_STEPS["warmup", 40], decay="cosine",
      weight_decay=0.05, grad_clip_norm=0.0, b1=0.9, b2=0.95,
      weight_decay_end=None, **MUON_AND_WSD,
      mu_dtype="float32", momentum=None, layer_decay=1.0, lr_mults=(),
      frozen="")
  assert config.mae.to_dict() == dict(
      mask_ratio=0.75, norm_pix_loss=True, decoder_hidden_size=512,
      decoder_num_layers=8, decoder_num_heads=16, decoder_mlp_dim=2048)
  assert config.augment == "mae_crop,flip" and not config.randaugment
  assert (config.model.posemb, config.model.gelu) == ("sincos2d", "exact")
  check_config(config)
  finetune = imagenet.get_config(f"finetune,{model}")
  base_lr, layer_decay, drop_path, epochs = {"B": (5e-4, 0.65, 0.1, 100),
                                             "L": (1e-3, 0.75, 0.2, 50),
                                             "H": (1e-3, 0.75, 0.3, 50)}[
                                                 model[0]]
  assert finetune.objective == "classification"
  assert finetune.total_steps == MAE_STEPS["finetune", epochs]
  assert finetune.optimizer.learning_rate == pytest.approx(base_lr * 4)
  assert finetune.optimizer.layer_decay == layer_decay
  assert finetune.optimizer.warmup_steps == MAE_STEPS["finewarm", 5]
  assert (finetune.label_smoothing, finetune.randaugment) == (0.1, "2,9")
  assert finetune.mixup.to_dict() == dict(prob=0.5, alpha=0.8)
  assert finetune.cutmix.to_dict() == dict(prob=0.5, alpha=1.0)
  assert finetune.model.drop_path_rate == drop_path
  assert finetune.random_erasing == 0.25
  check_config(finetune)
  probe = imagenet.get_config(f"linprobe,{model}")
  assert probe.objective == "linear_probe" and probe.batch_size == 16384
  assert probe.total_steps == MAE_STEPS["probe", 90]
  assert probe.optimizer.to_dict() | {"b1": None, "b2": None} == dict(
      name="lars", learning_rate=pytest.approx(0.1 * 16384 / 256),
      warmup_steps=MAE_STEPS["probewarm", 10], decay="cosine",
      weight_decay=0.0, grad_clip_norm=0.0, b1=None, b2=None,
      weight_decay_end=None, **MUON_AND_WSD,
      mu_dtype="float32", momentum=0.9, layer_decay=1.0, lr_mults=(),
      frozen="(?!head/).*")
  assert (probe.label_smoothing, probe.mixup.prob, probe.randaugment) == (
      0.0, 0.0, "")
  check_config(probe)
  with pytest.raises(ValueError, match="pretrain,MODEL,EPOCHS"):
    imagenet.get_config(f"pretrain,{model},400")


@pytest.mark.usefixtures("mock_tfds")
def test_mae_pretraining_runs_two_steps_on_its_crops(tmp_path):
  """mae_crop on JPEGs, the decoder at full size, the held-out loss on
  minival, a tiny encoder."""
  from configs.mae import imagenet  # pylint: disable=g-import-not-at-top
  config = shrunk(imagenet.get_config("pretrain,B/16,800"), image_size=32)
  for evaluator in config.evaluators.values():
    evaluator.split = small_split(evaluator.split)
  result = run_training(config, str(tmp_path))
  assert result["minival_loss"] > 0


@pytest.mark.parametrize("model, width, depth", [("B/16", 768, 12),
                                                 ("So400m/14", 1152, 27)])
def test_siglip_configs_are_the_papers(model, width, depth):
  """configs/siglip/pretrain.py: SigLIP's batch, rate, decay, b2 and
  length, both towers of the model's size, the chunked sigmoid loss, at
  full size, its program built (what vit_jax.plan compiles; no data
  read)."""
  from configs.siglip import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config(model)
  assert config.objective == "image_text" and config.batch_size == 32_768
  assert config.total_steps * 32_768 >= 9_000_000_000
  assert (config.optimizer.learning_rate, config.optimizer.weight_decay,
          config.optimizer.b2) == (1e-3, 1e-4, 0.95)
  assert (config.image_text.loss, config.image_text.chunked) == (
      "sigmoid", True)
  assert (config.image_text.text_hidden_size,
          config.image_text.text_num_layers) == (width, depth)
  assert (config.image_text.text_length, config.image_size) == (64, 224)
  assert config.model.classifier == "map"
  assert config.mesh.fsdp == 16
  config.mesh.fsdp = 8  # The tests' 8 devices.
  resolve.program(settings.of(config), num_classes=0)
