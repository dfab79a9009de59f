"""Self-distillation (config.objective "dino", DINOv2's recipe) on the
shared step: what it learns and serves, where its crops and masks come
from, how its teacher and centers move, resume, a pod, the export to
transformers' Dinov2Model. The losses against Meta's modules:
tests/test_dino_losses.py; the crops: tests/test_crops.py."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from safetensors.numpy import load_file

from tests.util import (
  call_tool,
  finish,
  latest_state,
  logged,
  main_flags,
  program_of,
  run_stopped_and_resumed,
  run_training,
  small_config,
  start_pod,
  train_steps,
)
from vit_jax import errors, sharding
from vit_jax.analysis import features as features_lib
from vit_jax.models import dino as dino_lib
from vit_jax.runs import settings
from vit_jax.training import (
  crops as crops_lib,
  dino_losses,
  objectives,
  optimizer,
  resolve,
)
from vit_jax.training.objectives import dino as dino_objective
from vit_jax.training.step import Held
from vit_jax.weights import exports, pretrained

# The digits model (8 px, patch 2: a 4x4 grid) of one layer (its steps
# compile in less time than two layers') with small heads, 2 local
# crops of 4 px (2x2), DINO's running center and DINOv3's Gram teacher
# (a carry to resume: taken for steps 4 and 7, not 10), the teacher's
# k-NN at the end; DINOv2's exact GELU (configs/dino/imagenet.py has it),
# which a timm state dict read back is taken to compute.
DINO = {"objective": "dino", "model.dropout_rate": 0.0,
        "model.num_layers": 1, "model.gelu": "exact",
        "dino.local_crops": 2, "dino.local_size": 4,
        "dino.head_prototypes": 32, "dino.head_hidden_size": 32,
        "dino.head_bottleneck": 16, "dino.centering": "center",
        "dino.teacher_warmup_steps": 4, "dino.freeze_prototypes_steps": 2,
        "dino.gram_weight": 1.0, "dino.gram_start": 4,
        "dino.gram_update_every": 3, "dino.gram_max_updates": 1,
        "total_steps": 12, "log_every": 1, "checkpoint_every": 6,
        "optimizer.learning_rate": 1e-3,
        "evaluators": {"knn": {"kind": "knn", "every": 12,
                               "datasets": {"digits": ("train", "test")}}}}


def objective_of(**overrides):
  keys = settings.of(small_config("", **{**DINO, **overrides}))
  return keys, objectives.of(keys)(keys, 10)


@pytest.fixture(scope="module")
def dino_run(digits_data_dir, tmp_path_factory):
  config = small_config(digits_data_dir, **DINO)
  workdir = str(tmp_path_factory.mktemp("dino"))
  last = run_training(config, workdir)
  return config, workdir, last


def test_a_dino_run_trains_a_teacher_that_follows_the_student(dino_run):
  config, workdir, last = dino_run
  state, _ = latest_state(workdir, config)
  assert int(state.step) == 12
  losses = logged(workdir)
  assert sorted(losses) == list(range(1, 13))
  for part in ("dino_loss", "koleo_loss", "ibot_loss"):
    assert all(np.isfinite(list(logged(workdir, part).values()))), part
  assert 0 <= last["knn/digits_20nn"] <= 1
  # The teacher (what the run serves) is neither the student nor where
  # both started: an average that trails the student.
  start = jax.device_get(program_of(config).init(jax.random.key(
      config.seed)))
  kernel = lambda p: np.asarray(p["Transformer"]["encoderblock_0"][
      "MlpBlock_3"]["Dense_0"]["kernel"])
  teacher, student, initial = (kernel(state.polyak), kernel(state.params),
                               kernel(start.params))
  assert not np.array_equal(teacher, student)
  moved_teacher = np.abs(teacher - initial).mean()
  moved_student = np.abs(student - initial).mean()
  assert 0 < moved_teacher < moved_student
  # The running centers moved from 0.
  assert np.abs(state.carry["dino"]).max() > 0
  assert np.abs(state.carry["ibot"]).max() > 0
  # Gram anchoring from step 4 (logged as 5) on.
  gram = logged(workdir, "gram_loss")
  assert all(gram[step] == 0 for step in range(1, 5)), gram
  assert all(gram[step] > 0 for step in range(5, 13)), gram


def test_the_gram_teacher_is_the_ema_teacher_of_the_step_before_its_own(
    dino_run):
  """Step 7's Gram teacher is the EMA teacher that taught step 6 (the
  checkpoint of step 6's), and none is taken for step 10 (one refresh
  after step 4's)."""
  from vit_jax.runs import checkpoints as checkpoints_lib
  from vit_jax.runs.workdir import Workdir
  config, workdir, _ = dino_run
  final, _ = latest_state(workdir, config)
  manager = Workdir(workdir).checkpoint_manager(3)
  sixth, _ = checkpoints_lib.restore_if_whole(
      manager, 6, program_of(config).state_shapes)
  sixth = jax.device_get(sixth)
  assert set(final.carry["gram"]) == set(final.polyak) - {"dino_head"}
  jax.tree.map(np.testing.assert_array_equal, final.carry["gram"],
               dino_lib.backbone_params(sixth.polyak))
  assert not np.array_equal(sixth.carry["gram"]["cls"], final.polyak["cls"])


def test_a_dino_run_stopped_by_sigterm_resumes_bitwise(
    dino_run, tmp_path, monkeypatch):
  """Student, teacher, centers and optimizer state."""
  config, straight, _ = dino_run
  resumed = str(tmp_path)
  run_stopped_and_resumed(config, resumed, monkeypatch, 5)
  expected, _ = latest_state(straight, config)
  state, _ = latest_state(resumed, config)
  jax.tree.map(np.testing.assert_array_equal, state, expected)
  assert logged(resumed) == logged(straight)
  assert logged(resumed, "knn/digits_20nn") == logged(straight,
                                                      "knn/digits_20nn")


@pytest.mark.parametrize("format_, out, kind", [
    ("hf", "dinov2", "transformers.Dinov2Model"),
    ("timm", "teacher.safetensors", "num_classes=0")])
def test_a_dino_run_exports_its_teacher(dino_run, tmp_path, format_, out,
                                        kind):
  """`export --format=hf`: a Dinov2Model directory (the layout read by
  weights/pytorch/hf.py, proven against transformers' own files in
  tests/test_recorded_libraries.py); `--format=timm`: a headless timm
  VisionTransformer. Read back, each's pooled features are the teacher's
  class token (transformers and timm themselves:
  benchmarks/compare_dinov2_export.py)."""
  config, workdir, _ = dino_run
  out = str(tmp_path / out)
  status, stdout, stderr = call_tool("export", f"--workdir={workdir}",
                                     f"--out={out}", f"--format={format_}")
  assert status == 0, stderr[-3000:]
  assert kind in stdout
  # A state dict does not say the head count (DINO's digits model: 4).
  exported = pretrained.for_inference(out, num_heads=4, features=True)
  images = np.random.default_rng(2).uniform(-1, 1, (3, 8, 8, 3)).astype(
      np.float32)
  theirs = features_lib.features(exported, images)
  state, _ = latest_state(workdir, config)
  _, objective = objective_of()
  ours = objective.features(state.polyak, images)
  np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5)


# DINOv2's options beside the project's default backbone: the released
# recipes' SwiGLU (configs/dino/imagenet.py; mlp_ratio 4 of width 32 as
# Dinov2SwiGLUFFN sizes it: 2/3, up to 8s), registers, DINOv3's RoPE.
OPTIONS = [
    ({"model.mlp": "swiglu", "model.mlp_dim": 88}, "Dinov2Model",
     {"use_swiglu_ffn": True, "mlp_ratio": 4}),
    ({"model.num_registers": 4}, "Dinov2WithRegistersModel",
     {"num_register_tokens": 4}),
    ({"model.rope": "axial", "model.posemb": "none"}, "DINOv3ViTModel",
     {"rope_theta": 100.0})]


@pytest.mark.parametrize("options, kind, said", OPTIONS)
def test_a_backbone_of_dinov2s_options_exports_to_transformers(
    tmp_path, options, kind, said):
  """export --format=hf of a self-distilled run with each option: the
  class its config.json names, its heads left out (the layouts proven
  against transformers' own files: tests/test_recorded_libraries.py,
  hf_dinov2_swiglu among them), its features the backbone's."""
  keys, objective = objective_of(**options)
  params = nn.meta.unbox(objective.init_params(jax.random.key(3), 8))
  out = str(tmp_path / "out")
  run = pretrained.Checkpoint(
      jax.tree.map(np.asarray, params), "the run",
      pretrained.run_function(keys), config=keys)
  assert kind in exports.write(run, "hf", out)
  with open(f"{out}/config.json") as f:
    config = json.load(f)
  assert config["architectures"] == [kind]
  assert {key: config[key] for key in said} == said
  if "model.mlp" in options:  # the hub's fused gate and up projections
    assert "encoder.layer.0.mlp.weights_in.weight" in load_file(
        f"{out}/model.safetensors")
  exported = pretrained.for_inference(out, num_heads=4, features=True)
  images = np.random.default_rng(2).uniform(-1, 1, (3, 8, 8, 3)).astype(
      np.float32)
  np.testing.assert_allclose(features_lib.features(exported, images),
                             objective.features(params, images),
                             rtol=1e-5, atol=1e-5)


def test_the_masks_and_crops_of_a_row_do_not_depend_on_its_batch():
  _, objective = objective_of()
  prepare = jax.jit(objective.prepare)  # Eager, the crops take seconds.
  images = jnp.asarray(np.random.default_rng(0).integers(
      0, 256, (6, 8, 8, 3)), jnp.uint8)
  batch = {"image": images, "mask": jnp.ones((6,))}
  whole = prepare(batch, 3)
  # Other images in the other rows: row 2's crops and masks stay.
  others = prepare({"image": images[::-1].at[2].set(images[2]),
                              "mask": batch["mask"]}, 3)
  for key in ("global", "local", "masks"):
    np.testing.assert_array_equal(others[key][2], whole[key][2])
    assert not np.array_equal(others[key][1], whole[key][1]) or key == (
        "masks")
  other_step = prepare(batch, 4)
  assert not np.array_equal(other_step["masks"], whole["masks"])
  assert whole["global"].shape == (6, 2, 8, 8, 3)
  assert whole["local"].shape == (6, 2, 4, 4, 3)
  # Steps 0 .. 3 of the temperature's warm-up, then the prototypes learn.
  np.testing.assert_allclose(whole["temperature"], 0.04 + 0.03 * 3 / 3)
  np.testing.assert_array_equal(whole["learn_prototypes"], 1)
  assert (prepare(batch, 1)["learn_prototypes"] == 0).all()


def test_block_masks_mask_what_they_are_asked_in_blocks():
  block_mask = jax.jit(dino_objective.block_mask, static_argnums=(1, 2, 4))
  counts = []
  for seed in range(40):
    target = 2 + seed % 7
    mask = block_mask(jax.random.key(seed), 4, 4, target, 8)
    count = int(mask.sum())
    assert count <= target
    counts.append(count == target)
  assert np.mean(counts) >= 0.75
  # A 14 x 14 grid masked at 40%: about that many, in few blocks.
  mask = np.asarray(block_mask(jax.random.key(0), 14, 14, 78,
                                98)).reshape(14, 14)
  assert 70 <= mask.sum() <= 78
  # Blocks: most masked patches have a masked neighbour.
  padded = np.pad(mask, 1)
  neighbours = (padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2]
                | padded[1:-1, 2:])
  assert (neighbours[mask]).mean() > 0.9
  # Half of the global crops, drawn per crop, are masked.
  _, objective = objective_of(**{"model.name": "Ti/16", "image_size": 224})
  masks = jax.jit(jax.vmap(objective.masks))(
      jax.random.split(jax.random.key(1), 200))
  shares = np.asarray(masks.reshape(400, -1).mean(-1))
  assert 0.4 < (shares > 0).mean() < 0.6
  assert shares.max() <= 0.5 and shares[shares > 0].min() >= 0.09


def test_the_schedules_are_dinov2s():
  dino = settings.of(small_config("", **DINO)).dino
  # numpy's linspace over the warm-up steps, then the final value.
  expected = np.linspace(0.04, 0.07, 4)
  for step in range(6):
    np.testing.assert_allclose(
        dino_objective.teacher_temperature(step, dino),
        expected[step] if step < 4 else 0.07, rtol=1e-6)
  # DINOv2's CosineScheduler from 0.992 to 1 over the run.
  for step in (0, 250, 999):
    value = 1 + 0.5 * (0.992 - 1) * (1 + np.cos(np.pi * step / 1000))
    np.testing.assert_allclose(
        dino_objective.teacher_momentum(step, 0.992, 1000), value, rtol=1e-6)


def test_the_dino_head_weight_normalises_its_prototypes():
  sizes = dino_lib.HeadSizes(prototypes=7, hidden_size=6, bottleneck=5,
                             layers=3)
  head = dino_lib.DinoHead(sizes)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)
  params = head.init(jax.random.key(0), x)["params"]
  params = jax.tree.map(lambda p: np.asarray(p), jax.device_get(
      jax.tree.map(lambda p: getattr(p, "value", p), params,
                   is_leaf=lambda p: hasattr(p, "value"))))
  params["prototype_scale"] = np.linspace(0.5, 2, 7).astype(np.float32)
  hidden = x
  for i in range(3):
    dense = params[f"Dense_{i}"]
    hidden = hidden @ dense["kernel"] + dense["bias"]
    if i < 2:
      hidden = jax.nn.gelu(hidden, approximate=False)
  hidden = hidden / np.linalg.norm(hidden, axis=-1, keepdims=True)
  v = params["prototypes"]
  expected = hidden @ (v / np.linalg.norm(v, axis=0) * params[
      "prototype_scale"])
  np.testing.assert_allclose(head.apply({"params": params}, x), expected,
                             rtol=1e-5, atol=1e-6)
  # The directions' lengths do not matter, only the scales.
  scaled = {**params, "prototypes": v * np.arange(1, 8)}
  np.testing.assert_allclose(head.apply({"params": scaled}, x), expected,
                             rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def taught():
  """The objective with KoLeo and iBOT off, its params, a teacher near them
  and a compiled step -> a micro-batch of 4 images, prepared and taught
  (compiled once: eager, the crops and the model cost half a minute)."""
  _, objective = objective_of(**{"dino.koleo_weight": 0.0,
                                 "dino.ibot_weight": 0.0})
  params = objective.init_params(jax.random.key(0), 8)
  params = jax.tree.map(lambda p: getattr(p, "value", p), params,
                        is_leaf=lambda p: hasattr(p, "value"))
  teacher = jax.tree.map(lambda p: p * 1.01, params)
  images = jnp.asarray(np.random.default_rng(0).integers(
      0, 256, (4, 8, 8, 3)), jnp.uint8)

  @jax.jit
  def micro(step):
    prepared = objective.prepare({"image": images, "mask": jnp.ones((4,))},
                                 step)
    held = Held(params, teacher, objective.init_carry(params), None)
    return objective.teach(held, prepared)

  return objective, params, micro


def test_the_loss_pairs_crops_as_dinov2_does(taught):
  """With KoLeo and iBOT off, the loss is DINOLoss's on the local crops
  against both teacher crops, plus twice its mean on the global crops
  against the other one, over 2 + 2 x locals terms (ssl_meta_arch.py),
  plus GramLoss's on the global crops (each image's own matrix, DINOv3's
  img_level)."""
  objective, params, micro = taught
  model = objective.model

  @jax.jit
  def ours_and_by_hand(params, micro):
    loss, parts = objective.loss(params, micro, jnp.full((4,), 0.25),
                                 jax.random.key(1))
    # The same by hand: DINOLoss over lists of crops, and GramLoss of the
    # global crops' patches against the Gram teacher's (the params).
    flat = micro["global"].reshape(8, 8, 8, 3)
    cls, patches = model.apply({"params": params}, flat, masks=micro[
        "masks"].reshape(8, -1), method=model.backbone)
    _, gram_patches = model.apply({"params": params}, flat,
                                  method=model.backbone)
    gram = dino_losses.gram_loss(patches, gram_patches)
    student_global = model.apply({"params": params}, cls,
                                 method=model.project).reshape(4, 2, -1)
    local = dino_lib.crops_as_patches(micro["local"].reshape(8, 4, 4, 3), 2)
    cls_local, _ = model.apply({"params": params}, local,
                               method=model.backbone)
    student_local = model.apply({"params": params}, cls_local,
                                method=model.project).reshape(4, 2, -1)
    t = micro["teacher_probs"]
    local_loss = dino_losses.dino_loss(
        [student_local[:, i] for i in range(2)], [t[:, 0], t[:, 1]])
    swapped = jnp.concatenate([t[:, 1], t[:, 0]])
    global_loss = 2 * dino_losses.dino_loss(
        [jnp.concatenate([student_global[:, 0], student_global[:, 1]])],
        [swapped])
    return (loss, parts, (local_loss + global_loss) / (2 + 4), gram)

  loss, parts, dino_by_hand, gram_by_hand = ours_and_by_hand(params,
                                                             micro(9))
  np.testing.assert_allclose(parts["dino_loss"], dino_by_hand, rtol=1e-5)
  np.testing.assert_allclose(parts["gram_loss"], gram_by_hand, rtol=1e-5)
  assert gram_by_hand > 0  # the student's crops are masked, not its
  np.testing.assert_allclose(loss, dino_by_hand + gram_by_hand, rtol=1e-5)
  # Before gram_start, no Gram anchoring.
  np.testing.assert_allclose(objective.loss(
      params, micro(3), jnp.full((4,), 0.25), jax.random.key(1))[1][
          "gram_loss"], 0)


def test_the_prototypes_learn_only_after_their_frozen_steps(taught):
  objective, params, micro = taught
  grads = jax.jit(jax.grad(lambda p, m: objective.loss(
      p, m, jnp.full((4,), 0.25), jax.random.key(0))[0]))
  frozen, learning = grads(params, micro(1)), grads(params, micro(2))
  for name in ("prototypes", "prototype_scale"):
    assert not np.asarray(frozen["dino_head"][name]).any(), name
    assert np.asarray(learning["dino_head"][name]).any(), name
  assert np.asarray(frozen["dino_head"]["Dense_0"]["kernel"]).any()


@pytest.mark.parametrize("overrides, message", [
    ({"accum_steps": 2}, "config.accum_steps=2 does not apply to "
     "config.objective='dino'"),
    ({"dino.centering": "mean"}, "config.dino.centering must be one of"),
    ({"mixup.prob": 0.5}, "config.mixup.prob=0.5 does not apply"),
    ({"dino.local_size": 5}, "config.dino.local_size=5 must be a multiple "
     "of the patch size 2"),
    ({"dino.mask_ratio": (0.5, 0.1)}, "config.dino.mask_ratio must be "
     "(low, high)"),
    ({"dino.gram_start": 12}, "config.dino.gram_start=12 is not a step of "
     "this run"),
    ({"dino.global_blur_probability": (0.5,)}, "config.dino.global_blur_"
     "probability must be a probability for each of the 2 global crops"),
    ({"evaluators.test": {"kind": "accuracy", "every": 3}},
     "a 'accuracy' evaluator does not apply to config.objective='dino'"),
])
def test_what_dino_cannot_do_is_refused_naming_the_key(overrides, message):
  config = small_config("", **DINO)
  config.update_from_flattened_dict(overrides)
  with pytest.raises(errors.ConfigError) as raised:
    resolve.program(settings.of(config), num_classes=10)
  assert message in str(raised.value)


def test_the_augmentations_probabilities_are_config_keys():
  """DINOv2's by default; a dataset whose meaning a flip or a colour
  changes (the digits) turns them off."""
  _, default = objective_of()
  assert default.spec == crops_lib.CropSpec(
      global_size=8, num_local=2, local_size=4)
  _, plain = objective_of(**{
      "dino.flip_probability": 0.0, "dino.jitter_probability": 0.0,
      "dino.grey_probability": 0.0, "dino.local_blur_probability": 0.0,
      "dino.global_blur_probability": (0.0, 0.0),
      "dino.global_solarize_probability": (0.0, 0.3)})
  assert (plain.spec.flip_prob, plain.spec.jitter_prob, plain.spec.grey_prob,
          plain.spec.local_blur_prob, plain.spec.global_blur_prob,
          plain.spec.global_solarize_prob) == (0, 0, 0, 0, (0, 0), (0, 0.3))


def test_the_crops_follow_the_row_not_the_mesh(digits_data_dir):
  """One device against data 2 x fsdp 2 x model 2 (Sinkhorn-Knopp's and
  KoLeo's sums over the global batch): the same losses, the prototype
  matrix split over fsdp."""
  sk = {**DINO, "dino.centering": "sinkhorn_knopp", "batch_size": 16}

  def first(config, devices):
    mesh = sharding.make_mesh(config.mesh, devices=devices)
    program = program_of(config, mesh=mesh)
    state = program.init(jax.random.key(config.seed))
    return train_steps(program, state, config, 2)

  one, _ = first(small_config(digits_data_dir, **sk,
                              mesh=dict(data=1, fsdp=1, model=1)),
                 jax.devices()[:1])
  split, state = first(small_config(digits_data_dir, **sk, **{
      "mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2,
      "mesh.fsdp_min_bytes": 0}), jax.devices())
  np.testing.assert_allclose(split, one, rtol=1e-5)
  prototypes = state.params["dino_head"]["prototypes"]
  assert "fsdp" in str(prototypes.sharding.spec)


def test_weight_decay_follows_a_cosine_to_its_end():
  opt = settings.of(small_config("", **{
      "optimizer.weight_decay": 0.04, "optimizer.weight_decay_end": 0.4,
      "optimizer.learning_rate": 1.0, "optimizer.warmup_steps": 0,
      "optimizer.name": "adam", "total_steps": 10})).optimizer
  tx, _ = optimizer.create(opt, 10)
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  for step in range(4):
    updates, state = tx.update(zeros, state, params)
    lr = 0.5 * (1 + np.cos(np.pi * step / 10))  # cosine from 1.0
    rate = 0.4 + (0.04 - 0.4) * 0.5 * (1 + np.cos(np.pi * step / 10))
    np.testing.assert_allclose(updates["kernel"], -lr * rate, rtol=1e-5)
    np.testing.assert_array_equal(updates["bias"], 0)


@pytest.mark.processes(2)  # A pod of two.
def test_a_pod_of_two_self_distils_like_one_process(dino_run,
                                                    digits_data_dir,
                                                    tmp_path):
  """The center's and KoLeo's sums over the global batch, each process
  holding half of it: the losses of the module's one-process run (1e-6).
  Sinkhorn-Knopp's sums over a split batch:
  test_the_crops_follow_the_row_not_the_mesh."""
  _, workdir, _ = dino_run
  pod = {**{key: value for key, value in DINO.items()
            if key != "evaluators"}, "evaluators.test.every": 0}
  pod_dir = str(tmp_path / "pod")
  code, _, stderr = finish(start_pod(2, 4, main_flags(
      pod_dir, digits_data_dir, **pod)))
  assert code == 0, stderr[-3000:]
  single, pods = logged(workdir), logged(pod_dir)
  assert sorted(pods) == list(range(1, 13))
  np.testing.assert_allclose([pods[s] for s in sorted(pods)],
                             [single[s] for s in sorted(pods)], rtol=1e-6)
