"""Image-text pre-training (config.objective "image_text", SigLIP's two
towers) on the shared step: the captions each row draws, the towers at
init, a run that classifies zero-shot, resume, a pod whose loss is
chunked across its processes, and what the objective refuses. The losses
themselves: tests/test_contrastive.py."""

import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.siglip import digits as siglip_digits
from tests.util import (
  SMALL,
  call_tool,
  finish,
  latest_state,
  logged,
  run_stopped_and_resumed,
  run_training,
  start_pod,
)
from vit_jax import errors, serving
from vit_jax.data import captions as captions_lib
from vit_jax.data.lazy_tensorflow import tf
from vit_jax.runs import settings
from vit_jax.training import objectives, resolve, step
from vit_jax.training.objectives import image_text
from vit_jax.weights import npz, pretrained
from vit_jax.weights.pytorch import siglip

# configs/siglip/digits.py's captions with the tests' small image tower
# (of one layer) on their data 4 x model 2 mesh, a text tower of one block
# over 8 tokens (a tokenizer of 64 pieces), the chunked sigmoid loss;
# zero-shot through the config's templates, which no caption used, at the
# end.
SIGLIP = {**{key: value for key, value in SMALL.items()
             if not key.startswith("evaluators.")},
          "model.num_layers": 1, "model.dropout_rate": 0.0,
          "image_text.tokenizer": "captions:64",
          "image_text.text_hidden_size": 32, "image_text.text_num_layers": 1,
          "image_text.text_num_heads": 2, "image_text.text_mlp_dim": 64,
          "image_text.text_vocab_size": 64, "image_text.text_length": 8,
          "total_steps": 12, "log_every": 1, "checkpoint_every": 6,
          "evaluators.zero_shot.every": 12}


def siglip_config(data_dir, **overrides):
  config = siglip_digits.get_config()
  config.update_from_flattened_dict({**SIGLIP, "data_dir": data_dir,
                                     **overrides})
  return config


def objective_of(**overrides):
  keys = settings.of(siglip_config("", **overrides))
  return objectives.of(keys)(keys, 10)


@pytest.fixture(scope="module")
def siglip_run(digits_data_dir, tmp_path_factory):
  config = siglip_config(digits_data_dir)
  workdir = str(tmp_path_factory.mktemp("siglip"))
  last = run_training(config, workdir)
  return config, workdir, last


def test_a_siglip_run_learns_and_classifies_zero_shot(siglip_run):
  _, workdir, last = siglip_run
  losses = logged(workdir)
  assert sorted(losses) == list(range(1, 13))
  assert losses[12] < losses[1]
  # SigLIP's start: t' = log 10, b = -10.
  np.testing.assert_allclose(logged(workdir, "temperature")[1], 10.0,
                             rtol=1e-6)
  np.testing.assert_allclose(logged(workdir, "bias")[1], -10.0, rtol=1e-6)
  accuracy = logged(workdir, "zero_shot/digits_accuracy")
  assert list(accuracy) == [12]
  assert 0.0 <= accuracy[12] <= 1.0
  assert last["zero_shot/digits_accuracy"] == accuracy[12]


def test_a_siglip_run_stopped_by_sigterm_resumes_bitwise(
    siglip_run, tmp_path, monkeypatch):
  """Both towers, t, b and the optimizer state; the captions drawn after
  the restart are the ones an uninterrupted run drew."""
  config, straight, _ = siglip_run
  resumed = str(tmp_path)
  run_stopped_and_resumed(config, resumed, monkeypatch, 5)
  expected, _ = latest_state(straight, config)
  state, _ = latest_state(resumed, config)
  jax.tree.map(np.testing.assert_array_equal, state, expected)
  assert logged(resumed) == logged(straight)
  assert (logged(resumed, "zero_shot/digits_accuracy")
          == logged(straight, "zero_shot/digits_accuracy"))


def test_a_siglip_run_exports_a_siglip_model(siglip_run, tmp_path):
  """`export --format=hf`: transformers' SiglipModel, and the default npz,
  big_vision's two towers (the layouts proven against the libraries' own
  files in tests/test_siglip_interchange.py), whose logits are the run's;
  a format of one tower is refused."""
  _, workdir, _ = siglip_run
  out = str(tmp_path / "siglip")
  status, stdout, stderr = call_tool("export", f"--workdir={workdir}",
                                     f"--out={out}", "--format=hf")
  assert status == 0, stderr[-3000:]
  assert "SiglipModel" in stdout
  objective = objective_of()
  images = np.random.default_rng(2).uniform(-1, 1, (3, 8, 8, 3)).astype(
      np.float32)
  ids = objective.tokenizer.encode(["a handwritten seven", "the digit 1"])
  ours = image_text.contrastive_logits(workdir, images, ids)
  np.testing.assert_allclose(image_text.contrastive_logits(out, images, ids),
                             ours, rtol=1e-5, atol=1e-5)
  status, _, stderr = call_tool("export", f"--workdir={workdir}",
                                f"--out={tmp_path / 'x.safetensors'}",
                                "--format=timm")
  assert status == 2
  assert "exports as --format=hf" in stderr
  status, stdout, stderr = call_tool("export", f"--workdir={workdir}",
                                     f"--out={tmp_path / 'towers.npz'}")
  assert status == 0, stderr[-3000:]
  np.testing.assert_allclose(
      image_text.contrastive_logits(str(tmp_path / "towers.npz"), images,
                                    ids), ours, rtol=1e-5, atol=1e-5)


def test_each_row_draws_one_of_its_class_captions_by_its_place():
  """Row r of step s draws from (seed, s, r): not from the rows around
  it; another step draws again; every draw is one of the class's
  captions, and over many draws every one of them comes."""
  objective = objective_of()
  table, counts = objective.caption_ids, objective.caption_counts
  # Each template with the word and the numeral.
  assert list(counts) == [2 * len(siglip_digits.TRAIN_TEMPLATES)] * 10
  labels = jnp.asarray(np.arange(64) % 10, jnp.int32)
  batch = {"image": jnp.zeros((64, 8, 8, 3), jnp.uint8), "label": labels,
           "mask": jnp.ones(64)}
  drawn = np.asarray(objective.prepare(batch, 3)["tokens"])
  for row, label in enumerate(np.asarray(labels)):
    assert any(np.array_equal(drawn[row], caption)
               for caption in table[label])
  half = {key: value[:32] for key, value in batch.items()}
  np.testing.assert_array_equal(objective.prepare(half, 3)["tokens"],
                                drawn[:32])
  assert not np.array_equal(objective.prepare(batch, 4)["tokens"], drawn)
  seen = {tuple(row) for step in range(20) for row in np.asarray(
      objective.prepare(batch, step)["tokens"])[labels == 7]}
  assert seen == {tuple(caption) for caption in table[7]}


def test_the_captions_are_every_template_with_every_name():
  assert captions_lib.of_classes(("a {}", "the {}."), ("seven|7", "x")) == [
      ["a seven", "a 7", "the seven.", "the 7."], ["a x", "the x."]]


def test_the_text_tower_pools_the_last_token_over_every_token():
  """Sticky end-of-text: a text's ids, then EOS to the length; the
  tower's embedding is its last token's, which attends to all."""
  objective = objective_of()
  ids = objective.tokenizer.encode(["a seven", "the digit 7"])
  assert ids[0, -1] == objective.tokenizer.eos_id
  params = objective.init_params(jax.random.key(0), 8)
  embedded = objective.text_features(params, ids)
  np.testing.assert_allclose(np.linalg.norm(embedded, axis=1), 1, rtol=1e-5)
  changed = ids.copy()
  changed[:, 0] = ids[:, 0] % 60 + 3
  assert not np.allclose(objective.text_features(params, changed), embedded)


@pytest.mark.parametrize("overrides, message", [
    ({"image_text.tokenizer": ""}, "config.image_text.tokenizer is unset"),
    ({"image_text.tokenizer": "captions:x"}, "captions:N takes a number"),
    ({"image_text.loss": "softmax"}, "set config.image_text.chunked=False"),
    ({"image_text.class_names": ("zero", "one")},
     "config.image_text.class_names has 2 entries for 10 classes"),
    ({"image_text.templates": ("a digit",)}, "must hold '{}' once"),
    ({"image_text.text_vocab_size": 50}, "more than config.image_text."
     "text_vocab_size=50"),
    ({"image_text.tokenizer": "/nowhere/spiece.model"},
     "no such tokenizer"),
    ({"evaluators.test": {"kind": "accuracy", "every": 3}},
     "a 'accuracy' evaluator does not apply to config.objective="
     "'image_text'"),
])
def test_what_image_text_cannot_do_is_refused_naming_the_key(overrides,
                                                             message):
  config = siglip_config("", **overrides)
  with pytest.raises(errors.InputError) as raised:
    resolve.program(settings.of(config), num_classes=10)
  assert message in str(raised.value)


@pytest.mark.processes(2)  # A pod of two.
def test_a_pod_of_two_trains_like_one_process(siglip_run, digits_data_dir,
                                              tmp_path):
  """The chunked loss's ring crosses the two processes (each holding half
  of the batch's rows): the losses of the module's one-process run
  (1e-6), whose ring tests/test_contrastive.py holds to the dense loss."""
  _, workdir, _ = siglip_run
  pod_dir = str(tmp_path / "pod")
  flags = {**SIGLIP, "data_dir": digits_data_dir,
           "evaluators.zero_shot.every": 0}
  code, _, stderr = finish(start_pod(2, 4, [
      "--config=configs/siglip/digits.py", f"--workdir={pod_dir}",
      *[f"--config.{key}={value}" for key, value in flags.items()]]))
  assert code == 0, stderr[-3000:]
  single, pods = logged(workdir), logged(pod_dir)
  assert sorted(pods) == list(range(1, 13))
  np.testing.assert_allclose([pods[s] for s in sorted(pods)],
                             [single[s] for s in sorted(pods)], rtol=1e-6)


# The recorded SiglipModel's sizes (tests/test_siglip_interchange.py): a
# run of them starts from it.
RECORDED = {"image_size": 32, "model.patch_size": 8, "model.hidden_size": 48,
            "model.num_layers": 2, "model.num_heads": 4, "model.mlp_dim": 96,
            "model.gelu": "tanh", "model.layer_norm_epsilon": 1e-6,
            "image_text.text_hidden_size": 32,
            "image_text.text_num_layers": 2, "image_text.text_num_heads": 4,
            "image_text.text_mlp_dim": 64, "image_text.text_vocab_size": 64,
            "image_text.text_length": 16}
SIGLIP_MODEL = os.path.join(os.path.dirname(__file__), "fixtures",
                            "libraries", "hf_siglip_two_towers", "hf")
SIGLIP_TOWER = os.path.join(os.path.dirname(__file__), "fixtures",
                            "libraries", "hf_siglip", "hf")


def initial_params_of(**overrides):
  keys = settings.of(siglip_config("", **{**RECORDED, **overrides}))
  fitted = resolve.program(keys, num_classes=10)
  program = step.build(fitted.settings, fitted.mesh, fitted.parts)
  return step.initial_params(program, fitted.settings)


def flat(tree):
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")


@pytest.mark.parametrize("scan", [False, True])
def test_a_two_tower_run_starts_from_a_siglip_model(scan):
  """Both towers, t and b as transformers' SiglipModel holds them, into
  scanned blocks or not."""
  params = initial_params_of(**{"init_from": SIGLIP_MODEL,
                                "model.scan_layers": scan})
  expected = siglip.read_two_towers(SIGLIP_MODEL).params
  if scan:
    params = {**params, **{tower: flax.traverse_util.unflatten_dict(
        npz.unscan_blocks(flat(params[tower])), sep="/")
                           for tower in ("img", "txt")}}
  assert flat(params).keys() == flat(expected).keys()
  for key, value in flat(expected).items():
    np.testing.assert_array_equal(flat(params)[key], value, err_msg=key)


def test_lit_starts_its_image_tower_from_a_vit():
  """init_from a ViT (a SigLIP vision tower alone): the image tower is
  its, the text tower fresh; config.optimizer.frozen='img/.*' locks it."""
  params = initial_params_of(init_from=SIGLIP_TOWER)
  tower = pretrained.load(SIGLIP_TOWER).params
  for key, value in flat(tower).items():
    np.testing.assert_array_equal(flat(params["img"])[key], value,
                                  err_msg=key)
  assert all(isinstance(leaf, jax.ShapeDtypeStruct)
             for leaf in jax.tree.leaves(params["txt"]))


def test_predict_classifies_zero_shot_by_class_names(siglip_run, tmp_path):
  """`predict --class_names`: each class's caption (one template, one
  name) embedded, the logits those of contrastive_logits on the same
  captions; the top class and SigLIP's probability, sigmoid(logit)."""
  _, workdir, _ = siglip_run
  names = list(siglip_digits.WORDS[:4])
  images = np.random.default_rng(4).integers(0, 255, (3, 8, 8, 3), np.uint8)
  classifier = image_text.ZeroShotClassifier(workdir, names, ("this is {}",))
  assert classifier.image_size == 8
  logits = classifier.logits(images)
  objective = objective_of()
  ids = objective.tokenizer.encode([f"this is {name}" for name in names])
  np.testing.assert_allclose(
      logits, image_text.contrastive_logits(workdir, images, ids),
      rtol=1e-5, atol=1e-5)
  files = []
  for i, image in enumerate(images):
    path = tmp_path / f"{i}.png"
    path.write_bytes(tf.io.encode_png(image).numpy())
    files.append(str(path))
  status, stdout, stderr = call_tool(
      "predict", f"--workdir={workdir}", f"--class_names={','.join(names)}",
      "--templates=this is {}", "--top=1", "--json", *files)
  assert status == 0, stderr[-3000:]
  rows = [json.loads(line) for line in stdout.splitlines()]
  for row, expected in zip(rows, logits):
    (top,) = row["top"]
    assert top["name"] == names[int(np.argmax(expected))]
    np.testing.assert_allclose(top["probability"],
                               1 / (1 + np.exp(-expected.max())), rtol=1e-5)


def test_a_zero_shot_classifier_exports_and_serves(siglip_run, tmp_path):
  """`export --class_names --format=stablehlo`: the classes' embeddings
  baked in, serving.py (JAX and numpy only) gives the classifier's logits
  and SigLIP's probabilities, the class names in its signature; what does
  not export so is refused in one line."""
  _, workdir, _ = siglip_run
  names = list(siglip_digits.WORDS[:3])
  out = str(tmp_path / "zero_shot.stablehlo")
  status, stdout, stderr = call_tool(
      "export", f"--workdir={workdir}", "--format=stablehlo", f"--out={out}",
      f"--class_names={','.join(names)}", "--templates=this is {},a {}")
  assert status == 0, stderr[-3000:]
  assert "zero-shot over 3 classes" in stdout
  served = serving.load(out)
  assert served.class_names == names and served.image_size == 8
  images = np.random.default_rng(5).integers(0, 255, (5, 8, 8, 3), np.uint8)
  expected = image_text.ZeroShotClassifier(
      workdir, names, ("this is {}", "a {}")).logits(images)
  out_of = served(images)
  np.testing.assert_allclose(out_of["logits"], expected, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(out_of["probabilities"],
                             1 / (1 + np.exp(-expected)), rtol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(out_of["pre_logits"], axis=1), 1,
                             rtol=1e-5)
  assert "sigmoid" in served.signature["outputs"]["probabilities"]["meaning"]
  status, _, stderr = call_tool(
      "export", f"--workdir={workdir}", "--format=hf",
      f"--out={tmp_path / 'hf'}", "--class_names=a,b")
  assert status == 2 and stderr.strip().splitlines()[-1].startswith(
      "error: --class_names: a zero-shot classifier exports as a function")


def test_a_siglip_model_without_a_tokenizer_asks_for_one(tmp_path):
  with pytest.raises(errors.InputError, match="give its SentencePiece "
                     "model with --tokenizer"):
    image_text.ZeroShotClassifier(SIGLIP_MODEL, ["a", "b"], ("{}",))


def test_two_towers_train_on_naflex_images(digits_data_dir, tmp_path):
  """SigLIP 2's NaFlex: each digit of digits/mixed_sizes at its own aspect
  ratio within 64 patches, through the image tower; zero-shot evaluated
  the same way."""
  config = siglip_config(digits_data_dir, **{
      "dataset": "digits/mixed_sizes", "image_size": 16,
      "naflex.max_num_patches": 64, "total_steps": 3,
      "evaluators.zero_shot.every": 3, "evaluators.zero_shot.datasets": {
          "digits/mixed_sizes": "test"}, "evaluators.seen_templates.every": 0})
  last = run_training(config, str(tmp_path))
  assert sorted(logged(str(tmp_path))) == [1, 2, 3]
  assert 0 <= last["zero_shot/digits/mixed_sizes_accuracy"] <= 1
