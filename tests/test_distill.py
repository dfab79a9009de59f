"""Distillation (config.distill): a frozen teacher's outputs as targets."""

import json
import logging
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import save_file

from tests import reference_vit
from tests.conftest import DIGITS_RUN
from tests.test_torch_interchange import random_tensors, timm_shapes
from tests.util import (
  call_tool,
  latest_checkpoint,
  logged,
  main_flags,
  metric_rows,
  program_of,
  run_tool,
  run_training,
  sigterm_at_step,
  small_config,
  typed,
)
from vit_jax import models, sharding
from vit_jax.models import flops
from vit_jax.training import distill, losses, step as step_lib


def test_a_copy_of_the_teacher_has_nothing_left_to_learn(digits_run,
                                                         digits_data_dir,
                                                         tmp_path):
  """A student that starts as its teacher matches it on the very images it
  sees, Mixup included: the distillation term starts at 0, and with no
  label loss it is the whole loss. Were the teacher shown the batch before
  mixing, or the student's images scaled otherwise, it would not be."""
  teacher, _, _, _ = digits_run
  config = small_config(digits_data_dir, **{
      **DIGITS_RUN, "total_steps": 3, "optimizer.warmup_steps": 1,
      "log_every": 1, "checkpoint_every": 3,
      "evaluators.test.every": 1, "init_from": teacher,
      "distill.teacher": teacher, "mixup.prob": 1.0, "mixup.alpha": 1.0})
  run_training(config, str(tmp_path))
  losses, distilled = logged(tmp_path), logged(tmp_path, "distill_loss")
  # Step 1 (at the warm-up's learning rate of 0) leaves the student as it
  # is; step 2 moves it off its teacher.
  assert distilled[1] == distilled[2] == pytest.approx(0.0, abs=1e-5)
  assert distilled[3] > 1e-4
  assert losses == distilled
  # Evaluated after step 1, the student is its teacher still.
  assert logged(tmp_path, "test_teacher_agreement")[1] == 1.0


def test_a_half_width_student_learns_from_the_digits_run(digits_run,
                                                          digits_data_dir,
                                                          tmp_path):
  """configs/distill/digits.py's recipe, shortened: function matching
  alone (no label loss) halves the distillation term and teaches the
  student the digits; its teacher agreement is the two checkpoints' on the
  test split; its FLOPs count the teacher's forward pass."""
  teacher, pngs, teacher_accuracy, _ = digits_run
  config = small_config(digits_data_dir, **{
      **DIGITS_RUN, "model.hidden_size": 32, "model.mlp_dim": 64,
      "total_steps": 150, "log_every": 10, "evaluators.test.every": 150,
      "checkpoint_every": 150, "distill.teacher": teacher})
  result = run_training(config, str(tmp_path))
  distilled = logged(tmp_path, "distill_loss")
  assert sorted(distilled) == list(range(10, 151, 10))
  assert distilled[150] <= distilled[10] / 2
  assert result["test_accuracy"] >= 0.8 * teacher_accuracy
  # It learned the teacher's function, its mistakes too: it agrees with the
  # teacher on more images than either is right on.
  assert result["test_teacher_agreement"] >= max(result["test_accuracy"],
                                                 teacher_accuracy)
  # And it is the share of the test images on which the student's
  # checkpoint and the teacher's top classes agree, counted here: each
  # image decoded by PIL, in [-1, 1] in numpy, each model applied to all
  # of them at once.
  from PIL import Image  # pylint: disable=g-import-not-at-top
  assert config.polyak_decay == 0  # The params are what was evaluated.
  _, student_params, _ = latest_checkpoint(str(tmp_path), config)
  loaded = distill.load(typed(config))
  files = sorted(os.listdir(pngs))
  images = np.stack([np.asarray(Image.open(os.path.join(pngs, name)).convert(
      "RGB")) for name in files]).astype(np.float32) / 127.5 - 1
  top = [np.asarray(jax.jit(lambda p, m=model: m.apply(
      {"params": p}, images, train=False))(params)).argmax(-1)
         for model, params in ((program_of(config).model, student_params),
                               (loaded.model, loaded.params))]
  assert len(files) == result["test_examples"] == 360
  assert result["test_teacher_agreement"] == pytest.approx(
      np.mean(top[0] == top[1]), abs=0.1 / len(files))
  alone = small_config(digits_data_dir, **{**DIGITS_RUN,
                                           "model.hidden_size": 32,
                                           "model.mlp_dim": 64})
  row = next(r for r in metric_rows(tmp_path) if "flops_per_step" in r)
  student = typed(alone)
  built = step_lib.parts(student, 10)
  assert row["flops_per_step"] == pytest.approx(config.batch_size * (
      flops.flops_per_image(built.model, 8, train=True)
      + flops.flops_per_image(loaded.model, 8)))


@pytest.mark.parametrize("kind", distill.KINDS)
def test_each_kind_of_term_and_each_head_of_a_deit_student(kind):
  """The loss of a batch, against its definition: label_weight x the
  label cross-entropy + (1 - label_weight) x the distillation term (soft:
  T^2 KL at temperature T; hard: the cross-entropy with the teacher's top
  class). A student with a distillation token learns the labels by its
  class head and the teacher by its distillation head, and predicts with
  their mean."""
  model = models.create("Ti/2", 10, hidden_size=32, num_layers=1, mlp_dim=64,
                        num_heads=4, distill_token=True)
  images = jax.random.uniform(jax.random.key(1), (6, 8, 8, 3), minval=-1)
  params = nn.meta.unbox(model.init(jax.random.key(0), images,
                                    train=False)["params"])
  # Heads start at zero; random ones tell the two apart.
  for head in ("head", "head_dist"):
    params[head]["kernel"] = jax.random.normal(
        jax.random.key(len(head)), params[head]["kernel"].shape)
  labels = np.arange(6) % 10
  teacher_logits = 3 * jax.random.normal(jax.random.key(2), (6, 10))
  teacher = distill.Teacher(None, None, 8, "a teacher", kind, 2.0, 0.25)
  weights = np.full(6, 1 / 6)
  loss, parts = losses.of_batch(model, params, images, labels, weights,
                                jax.random.key(3), "softmax", teacher,
                                teacher_logits)
  class_logits, distill_logits = model.apply(
      {"params": params}, images, train=False, both_heads=True)
  np.testing.assert_allclose(
      model.apply({"params": params}, images, train=False),
      (class_logits + distill_logits) / 2, rtol=1e-6)
  if kind == "soft":
    t = 2.0
    p = jax.nn.softmax(teacher_logits / t)
    term = t * t * (p * (jnp.log(p) - jax.nn.log_softmax(
        distill_logits / t))).sum(-1)
  else:
    term = optax.softmax_cross_entropy_with_integer_labels(
        distill_logits, teacher_logits.argmax(-1))
  label_term = optax.softmax_cross_entropy_with_integer_labels(class_logits,
                                                               labels)
  np.testing.assert_allclose(parts["distill_loss"], term.mean(), rtol=1e-5)
  np.testing.assert_allclose(
      loss, (0.25 * label_term + 0.75 * term).mean(), rtol=1e-5)


def test_a_distilling_run_stopped_by_sigterm_resumes_bitwise(
    digits_run, digits_data_dir, tmp_path, monkeypatch):
  """The teacher is read again on resume and never saved: a run stopped by
  SIGTERM (saved at the step it was in) and resumed ends with the
  uninterrupted run's params, bit for bit, having logged the same
  distillation losses. DeiT's recipe (configs/distill/digits.py:deit): a
  student with a distillation token, hard distillation. The student reads
  16-pixel images, which the 8-pixel teacher sees resized."""
  teacher, _, _, _ = digits_run
  config = small_config(digits_data_dir, **{
      "distill.teacher": teacher, "distill.label_weight": 0.5,
      "distill.kind": "hard", "model.distill_token": True, "log_every": 1,
      "image_size": 16, "model.patch_size": 4})
  run_training(config, str(tmp_path / "straight"))
  with monkeypatch.context() as patch:
    sigterm_at_step(patch, 4)
    stopped = run_training(config, str(tmp_path / "resumed"))
  assert stopped["stopped_at_step"] == 4
  assert latest_checkpoint(str(tmp_path / "resumed"), config)[0] == 4
  run_training(config, str(tmp_path / "resumed"))
  step_a, straight, _ = latest_checkpoint(str(tmp_path / "straight"), config)
  step_b, resumed, _ = latest_checkpoint(str(tmp_path / "resumed"), config)
  assert step_a == step_b == 6
  assert resumed["dist"].shape == (1, 1, 32)  # The student's own token.
  jax.tree.map(np.testing.assert_array_equal, resumed, straight)
  distilled = logged(tmp_path / "straight", "distill_loss")
  assert logged(tmp_path / "resumed", "distill_loss") == distilled
  assert distilled[6] < distilled[1]
  assert 0 < logged(tmp_path / "resumed", "test_teacher_agreement")[6] <= 1


def test_the_teacher_is_sharded_as_the_student_and_kept_out_of_the_state(
    digits_run):
  """Over a mesh with an fsdp axis the teacher's large kernels are split as
  the student's are, its params float32 and its compute the student's
  (bfloat16 here); the train state (what checkpoints hold) has no part of
  it."""
  teacher, _, _, run_config = digits_run
  config = run_config.copy_and_resolve_references()
  config.distill.teacher = teacher
  config.model.dtype = "bfloat16"
  config.mesh.update(data=2, fsdp=2, model=2)
  config.mesh.fsdp_min_bytes = 0
  keys = typed(config)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "model": 2})
  loaded = distill.load(keys)
  program = step_lib.build(keys, mesh, step_lib.parts(keys, 10, loaded))
  shapes = program.frozen.shapes
  mlp = shapes["Transformer"]["encoderblock_0"]["MlpBlock_3"]["Dense_0"]
  assert set(mlp["kernel"].sharding.spec) == {"fsdp", "model"}
  assert mlp["kernel"].dtype == np.float32
  assert program.frozen.teacher.model.config.dtype == "bfloat16"
  state_leaves = jax.tree.leaves(program.state_shapes)
  teacher_leaves = jax.tree.leaves(shapes)
  assert sum(x.size for x in state_leaves) < 4 * sum(
      x.size for x in teacher_leaves)  # Params, 2 moments, a counter.
  assert "teacher" not in str(jax.tree.structure(program.state_shapes))


@pytest.mark.parametrize("overrides, message", [
    ({"distill.teacher": "{missing}"},
     "error: config.distill.teacher='{missing}': {missing} holds no run: it "
     "has no config.json"),
    ({"distill.teacher": "{gone}"},
     "error: config.distill.teacher='{gone}': {gone} does not exist: a "
     "source is a workdir of ours, an .npz, an HF transformers directory, a "
     "timm .safetensors file or hf://ORG/NAME"),
    ({"distill.kind": "token", "distill.teacher": "{teacher}"},
     "error: config.distill.kind must be one of ['soft', 'hard'], got "
     "'token'"),
    ({"distill.teacher": "{teacher}", "model.distill_token": True},
     "error: config.distill.label_weight=0.0: a student with a distillation "
     "token learns the labels by its class head and the teacher by its "
     "distillation head; give each a share, 0 < label_weight < 1 (DeiT's: "
     "0.5)"),
    ({"model.distill_token": True, "model.classifier": "gap"},
     "error: config.model: distill_token: the distillation token is read "
     "beside the class token; it needs classifier 'token', got 'gap'"),
    ({"distill.temperature": 0.0, "distill.teacher": "{teacher}"},
     "error: config.distill.temperature must be > 0, got 0.0"),
    ({"distill.teacher": "{teacher}",
      "distill.teacher_mean": "123.675,116.28,103.53",
      "distill.teacher_std": "58.395,57.12,57.375"},
     "error: config.distill.teacher_mean takes 3 numbers in [0, 1] (of "
     "pixels / 255), R,G,B; got (123.675, 116.28, 103.53)"),
    ({"distill.teacher": "{teacher}", "distill.teacher_std": "0.5,0.5,0.5"},
     "error: config.distill.teacher_std: give teacher_mean and teacher_std "
     "both, or neither"),
    ({"distill.teacher": "{teacher}", "dataset": "digits/5to9"},
     "error: config.distill.teacher {teacher} step 100 (params) predicts 10 "
     "classes, the dataset has 5: a teacher must classify the student's "
     "classes"),
])
def test_a_teacher_that_cannot_teach_is_refused_in_one_line(
    digits_run, digits_data_dir, tmp_path, overrides, message):
  teacher, _, _, _ = digits_run
  names = {"teacher": teacher, "missing": str(tmp_path / "no_run"),
           "gone": str(tmp_path / "gone")}
  (tmp_path / "no_run").mkdir()
  flags = main_flags(tmp_path / "run", digits_data_dir, **{
      key: value.format(**names) if isinstance(value, str) else value
      for key, value in overrides.items()})
  status, stdout, stderr = call_tool("main", *flags)
  assert (status, stderr.splitlines()[-1:]) == (2, [message.format(**names)])
  assert "Training" not in stdout
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_plan_counts_the_teacher_in_flops_and_memory(digits_run):
  """configs/distill/digits.py planned on v3-8: the model FLOPs are the
  student's training step and the teacher's forward pass, and the
  teacher's float32 params are among the step's arguments in HBM."""
  teacher, _, _, _ = digits_run
  got = json.loads(run_tool(
      "plan", "--config=configs/distill/digits.py",
      f"--config.distill.teacher={teacher}", "--topology=v3-8", "--json"))
  student = models.create("Ti/2", 10, hidden_size=32, mlp_dim=128,
                          num_layers=4, num_heads=4)
  loaded = distill.load(typed(small_config("", **{
      **DIGITS_RUN, "distill.teacher": teacher})))
  model_flops = (flops.flops_per_image(student, 8, train=True)
                 + flops.flops_per_image(loaded.model, 8)) * 128 / 8
  assert got["model_flops_per_core_per_step"] == pytest.approx(model_flops)
  assert got["flops_per_core_per_step"] > 0.9 * model_flops
  sizes = [sum(x.size for x in jax.tree.leaves(tree)) for tree in (
      jax.eval_shape(lambda: student.init(
          jax.random.key(0), np.zeros((1, 8, 8, 3)), train=False)),
      loaded.params)]
  # Replicated over the 8 cores: the student's params and Adam's moments,
  # 12 bytes each, and the teacher's params, 4.
  assert 12 * sizes[0] + 4 * sizes[1] < got["hbm_argument_bytes"] < (
      12 * sizes[0] + 4 * sizes[1] + 2**20)


def test_a_timm_teachers_input_is_what_its_config_keys_say(tmp_path,
                                                             caplog):
  """A timm file says nothing of its input: the teacher's is assumed
  (mean and std 0.5, timm's VisionTransformer's default), the log naming
  the config keys that change it; config.distill.teacher_mean and
  teacher_std give it. Either way the teacher's logits on the student's
  8-pixel images are its own, computed here in numpy, on (pixels / 255 -
  mean) / std of those images resized to its 16 pixels."""
  # Ti's width, whose head count (3) the file's shapes say.
  tensors = random_tensors(timm_shapes(width=192))
  path = str(tmp_path / "teacher.safetensors")
  save_file(tensors, path)
  pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), np.uint8)
  # Bilinear, 8 -> 16 pixels a side; linear, so the same on pixels as on
  # the student's [-1, 1].
  resize = reference_vit._resize_matrix(16, 8)  # pylint: disable=protected-access
  resized = np.einsum("ia,nabc,jb->nijc", resize, pixels.astype(np.float64),
                      resize)

  def logits(**keys):
    teacher = distill.load(typed(small_config("", **{
        "distill.teacher": path, **keys})))
    assert teacher.image_size == 16
    return np.asarray(teacher.logits(teacher.params, pixels))

  with caplog.at_level(logging.WARNING):
    assumed = logits()
  assert caplog.messages.count(
      f"note: {path} says nothing of its input; assuming "
      "--config.distill.teacher_mean=0.5,0.5,0.5 "
      "--config.distill.teacher_std=0.5,0.5,0.5 (set those config keys to "
      "change it)") == 1
  caplog.clear()
  mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
  with caplog.at_level(logging.WARNING):
    given = logits(**{"distill.teacher_mean": mean,
                      "distill.teacher_std": std})
  assert not [line for line in caplog.messages if line.startswith("note:")]
  for shown, (m, s) in ((assumed, (0.5, 0.5)), (given, (mean, std))):
    expected = reference_vit.forward_timm(
        tensors, (resized / 255 - np.asarray(m)) / np.asarray(s), 3)
    np.testing.assert_allclose(shown, expected, rtol=1e-4, atol=1e-4)
  assert np.abs(given - assumed).max() > 0.1
