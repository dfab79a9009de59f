"""Masked autoencoders (config.objective "mae") on the shared step: what they
learn, where their masks come from, what they cost, how they resume, and
the objective seam they stand on. Interchange with transformers:
tests/test_mae_interchange.py."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.util import (
  call_tool,
  latest_checkpoint,
  latest_state,
  logged,
  program_of,
  run_stopped_and_resumed,
  run_training,
  small_config,
  train_steps,
)
from vit_jax import errors, sharding
from vit_jax.analysis import reconstructions
from vit_jax.models import config as config_lib, flops, heads, mae, naflex
from vit_jax.runs import settings
from vit_jax.training import objectives, optimizer, resolve, step as step_lib
from vit_jax.training.objectives import linear_probe, mae as mae_objective

# The digits model with a small decoder; the held-out reconstruction loss
# and 10-shot features evaluated at steps 12 and 24.
MAE = {"objective": "mae", "model.posemb": "sincos2d",
       "mae.decoder_hidden_size": 32, "mae.decoder_num_layers": 1,
       "mae.decoder_num_heads": 4, "mae.decoder_mlp_dim": 64,
       "total_steps": 24, "log_every": 1, "checkpoint_every": 12,
       "optimizer.learning_rate": 1e-3,
       "evaluators": {
           "test": {"kind": "loss", "every": 12, "split": "test"},
           "fewshot": {"kind": "fewshot", "every": 12, "shots": (10,),
                       "datasets": {"digits": ("train", "test")}}}}


def test_config_objective_offers_every_objective_and_only_those():
  field = {f.name: f for f in dataclasses.fields(settings.Settings)}[
      "objective"]
  assert set(field.metadata["choices"]) == set(objectives.REGISTRY)
  for name, objective in objectives.REGISTRY.items():
    assert objective.name == name


@pytest.fixture(scope="module")
def mae_run(digits_data_dir, tmp_path_factory):
  config = small_config(digits_data_dir, **MAE)
  workdir = str(tmp_path_factory.mktemp("mae"))
  last = run_training(config, workdir)
  return config, workdir, last


def test_an_mae_run_learns_to_reconstruct_without_labels(mae_run):
  config, workdir, last = mae_run
  losses = logged(workdir)
  assert sorted(losses) == list(range(1, 25))
  assert losses[24] < losses[1] / 2, losses
  held_out = logged(workdir, "test_loss")
  assert sorted(held_out) == [12, 24] and held_out[24] < held_out[12]
  assert last["test_examples"] == 360
  # The encoder's class token, read by a ridge regression from 10 labels
  # a class, beats chance (0.1) by far after 24 steps.
  assert last["fewshot/digits_10shot"] > 0.3


def test_reconstruct_reads_an_mae_runs_workdir(mae_run):
  """What a user compares with another library: the run's masked
  autoencoder on given images and noise, its held-out loss's function."""
  config, workdir, _ = mae_run
  images = np.random.default_rng(0).uniform(-1, 1, (2, 8, 8, 3)).astype(
      np.float32)
  noise = np.random.default_rng(1).random((2, 16)).astype(np.float32)
  loss, reconstructions, removed = mae_objective.reconstruct(
      workdir, images, noise)
  assert reconstructions.shape == (2, 16, 2 * 2 * 3)
  np.testing.assert_array_equal(removed.sum(axis=1), [12, 12])
  # The 4 patches of the smallest noise are the ones kept.
  np.testing.assert_array_equal(
      np.sort(np.argsort(noise, axis=1)[:, :4], axis=1),
      np.sort(np.nonzero(np.asarray(removed) == 0)[1].reshape(2, 4), axis=1))
  keys = settings.of(config)
  _, params, _ = latest_checkpoint(workdir, config)
  expected, _, _ = mae_objective.reconstruct_with(
      mae_objective.model_of(keys), params, images, noise, True)
  assert float(loss) == float(expected) and 0 < float(loss) < 2
  with pytest.raises(errors.InputError, match="neither a workdir"):
    mae_objective.reconstruct(str(config.data_dir), images, noise)


def test_the_figures_of_an_mae_run_show_its_reconstructions(mae_run,
                                                           tmp_path):
  config, workdir, _ = mae_run
  out = str(tmp_path / "figures")
  status, _, stderr = call_tool("figures", f"--workdir={workdir}",
                                f"--data_dir={config.data_dir}",
                                f"--out={out}", "--num_images=8")
  assert status == 0, stderr[-3000:]
  assert os.path.getsize(os.path.join(out, "reconstructions.png")) > 0
  images = np.random.default_rng(0).integers(0, 256, (3, 8, 8, 3),
                                             dtype=np.uint8)
  pictures, losses = reconstructions.of_run(workdir, images)
  assert pictures.shape == (4, 3, 8, 8, 3) and losses.shape == (3,)
  np.testing.assert_array_equal(pictures[0], images)
  # Where a patch is visible, the pasted picture is the image's own.
  visible = pictures[1] != 128
  np.testing.assert_array_equal(pictures[3][visible], images[visible])
  assert 0.2 < visible.mean() < 0.3  # A quarter of the patches, about.


def test_an_mae_run_exports_as_transformers_vitmae(mae_run, tmp_path):
  """`export --format=hf` of an MAE run: a ViTMAEForPreTraining directory
  (weights/pytorch/mae.py; its layout proven against transformers' own
  files in tests/test_mae_interchange.py) that computes as the run does."""
  _, workdir, _ = mae_run
  out = str(tmp_path / "vit-mae")
  status, stdout, stderr = call_tool("export", f"--workdir={workdir}",
                                     f"--out={out}", "--format=hf")
  assert status == 0, stderr[-3000:]
  assert "transformers.ViTMAEForPreTraining" in stdout
  images = np.random.default_rng(2).uniform(-1, 1, (2, 8, 8, 3)).astype(
      np.float32)
  noise = np.random.default_rng(3).random((2, 16)).astype(np.float32)
  theirs = mae_objective.reconstruct(out, images, noise)
  ours = mae_objective.reconstruct(workdir, images, noise)
  # Our fixed tables are computed in float32 at each kept patch; the file's
  # were computed in float64: a few 1e-7 apart.
  np.testing.assert_allclose(theirs[1], ours[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(theirs[2], ours[2])


def test_an_mae_run_stopped_by_sigterm_resumes_bitwise(
    mae_run, tmp_path, monkeypatch):
  config, straight, _ = mae_run
  resumed = str(tmp_path)
  run_stopped_and_resumed(config, resumed, monkeypatch, 7)
  step_a, expected, _ = latest_checkpoint(straight, config)
  step_b, params, _ = latest_checkpoint(resumed, config)
  assert step_a == step_b == 24
  jax.tree.map(np.testing.assert_array_equal, params, expected)
  assert logged(resumed) == logged(straight)
  assert logged(resumed, "test_loss") == logged(straight, "test_loss")


def first_losses(config, devices, num_steps=3):
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  program = program_of(config, mesh=mesh)
  state = program.init(jax.random.key(config.seed))
  return train_steps(program, state, config, num_steps)


def test_masks_follow_the_example_not_the_mesh_or_the_micro_batches(
    digits_data_dir):
  """Each image's mask is drawn from (seed, step, its row of the global
  batch): on one device, on data 2 x fsdp 2 x model 2, and in 4
  micro-batches, the losses are the same up to float rounding (without
  dropout, whose draws are the micro-batch's)."""
  no_dropout = {**MAE, "model.dropout_rate": 0.0}
  one, state_one = first_losses(
      small_config(digits_data_dir, **no_dropout,
                   mesh=dict(data=1, fsdp=1, model=1)), jax.devices()[:1])
  split, state_split = first_losses(
      small_config(digits_data_dir, **no_dropout,
                   mesh=dict(data=2, fsdp=2, model=2)), jax.devices())
  micro, _ = first_losses(
      small_config(digits_data_dir, **no_dropout, accum_steps=4),
      jax.devices())
  assert one[-1] < one[0]
  np.testing.assert_allclose(split, one, rtol=1e-5)
  np.testing.assert_allclose(micro, one, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
               state_split.params, state_one.params)
  # The decoder's kernels are split over the model axis as the encoder's.
  kernel = state_split.params["decoder"]["embed"]["kernel"]
  assert kernel.sharding.spec == jax.P("fsdp", "model")


def test_the_noise_of_a_row_does_not_depend_on_the_batch_it_is_in():
  keys = settings.of(small_config("", **MAE))
  objective = objectives.of(keys)(keys, 10)
  images = jnp.zeros((8, 8, 8, 3), jnp.uint8)
  whole = objective.noise(images, 5)
  assert whole.shape == (8, 16)
  np.testing.assert_array_equal(objective.noise(images[:3], 5), whole[:3])
  assert not np.array_equal(objective.noise(images, 6), whole)
  # A quarter of each image's patches are kept: 4 of 16.
  removed = mae.removed_mask(mae.kept(whole, 4), 16)
  np.testing.assert_array_equal(removed.sum(axis=1), 12)


def xla_flops(model, images, noise):
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), images,
                                             train=False))["params"]
  forward = jax.jit(lambda p, x, n: model.apply({"params": p}, x,
                                                train=False, noise=n))
  cost = forward.lower(params, images, noise).compile().cost_analysis()
  return (cost[0] if isinstance(cost, list) else cost)["flops"]


def test_the_encoder_costs_the_kept_patches_only():
  """The analytic count (MFU, the plan) agrees with XLA's: the encoder's
  blocks at a quarter of the tokens, the decoder at all of them."""
  encoder = config_lib.ViTConfig(patch_size=16, hidden_size=192,
                                 num_layers=12, num_heads=3, mlp_dim=768,
                                 posemb="sincos2d")
  model = mae.MaskedAutoencoder(
      encoder, mae.decoder_config(encoder, mae.DecoderSizes(128, 2, 4, 512)))
  images = jnp.zeros((1, 224, 224, 3), jnp.float32)
  noise = jnp.zeros((1, 196), jnp.float32)
  analytic = flops.flops_per_image(model, 224)
  assert analytic == pytest.approx(xla_flops(model, images, noise), rel=0.05)
  # Less than half of the whole encoder's on every patch.
  whole = flops.flops_per_image(dataclasses.replace(
      model, mask_ratio=1e-9), 224)
  assert analytic < 0.5 * whole


@pytest.mark.parametrize("overrides, message", [
    ({"model.mpp": True}, "config.model.mpp=True does not apply to "
     "config.objective='mae'"),
    ({"mixup.prob": 0.5}, "config.mixup.prob=0.5 does not apply"),
    ({"naflex.packing": True, "naflex.max_num_patches": 16},
     "config.naflex.packing=True does not apply"),
    ({"mae.mask_ratio": 0.0}, "config.mae.mask_ratio must be in (0, 1)"),
    ({"mae.decoder_num_heads": 5}, "decoder_num_heads=5 does not divide"),
    ({"evaluators.test.kind": "accuracy"},
     "config.evaluators.test: a 'accuracy' evaluator does not apply to "
     "config.objective='mae', which takes ['loss', 'fewshot', 'knn']"),
    ({"objective": "simclr"}, "config.objective must be one of "
     "['classification', 'mae', 'dino', 'image_text', 'linear_probe'], got 'simclr'"),
])
def test_what_mae_cannot_do_is_refused_naming_the_key(overrides, message):
  config = small_config("", **MAE)
  config.update_from_flattened_dict(overrides)
  with pytest.raises(errors.ConfigError) as raised:
    resolve.program(settings.of(config), num_classes=10)
  assert message in str(raised.value)


# MAE's linear probe of the run above: the head of its frozen encoder,
# through a batch norm without scale or bias; by Adam, which learns in 8
# steps what LARS (its own test below) would take hundreds for.
PROBE = {"objective": "linear_probe", "model.posemb": "sincos2d",
         "optimizer.name": "adam", "optimizer.learning_rate": 0.1,
         "optimizer.weight_decay": 0.0,
         "optimizer.frozen": linear_probe.PROBE_FROZEN, "total_steps": 8,
         "log_every": 1, "checkpoint_every": 4,
         "evaluators": {"test": {"kind": "accuracy", "every": 8,
                                 "split": "test"}}}


@pytest.fixture(scope="module")
def probe_run(mae_run, tmp_path_factory):
  mae_config, mae_workdir, _ = mae_run
  config = small_config(mae_config.data_dir, init_from=mae_workdir, **PROBE)
  workdir = str(tmp_path_factory.mktemp("probe"))
  last = run_training(config, workdir)
  return config, workdir, last


def test_a_linear_probe_trains_the_head_and_serves_the_norm_folded_in(
    probe_run):
  config, workdir, last = probe_run
  keys = settings.of(config)
  program = program_of(config)
  start = jax.device_get(step_lib.initial_state(program, keys))
  state, _ = latest_state(workdir, config)
  assert int(state.step) == 8
  names = lambda tree: {"/".join(str(k.key) for k in path): leaf for path,
                        leaf in jax.tree_util.tree_leaves_with_path(tree)}
  before, after = names(start.params), names(state.params)
  for name in before:
    if name.startswith("head/"):
      assert not np.array_equal(before[name], after[name]), name
    else:  # The encoder is MAE's, untouched.
      np.testing.assert_array_equal(before[name], after[name], err_msg=name)
  # The running statistics moved from torch's start (0, 1).
  assert not np.allclose(state.carry["mean"], 0)
  # What is served (evaluated, exported) is the head with the running
  # normalisation folded in: the same logits as normalising, then the head.
  images = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 3)).astype(
      np.float32)
  logits, features = heads.logits_and_pre_logits(program.model, state.params,
                                                 images)
  normalised = (features - state.carry["mean"]) / np.sqrt(
      state.carry["var"] + linear_probe.EPSILON)
  expected = normalised @ state.params["head"]["kernel"] + state.params[
      "head"]["bias"]
  served = program.model.apply({"params": state.polyak}, images, train=False)
  np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)
  assert not np.allclose(logits, expected)
  # It learns; in 8 steps the running statistics (from torch's 0 and 1,
  # at momentum 0.1) are still far from the features', so the served
  # accuracy is low: docs/mae.md has the probe of a longer run.
  losses = logged(workdir)
  assert min(losses[6], losses[7], losses[8]) < losses[1] - 0.2, losses
  assert last["test_accuracy"] > 0.15, last


def test_a_linear_probe_stopped_by_sigterm_resumes_bitwise(
    probe_run, tmp_path, monkeypatch):
  """Its running statistics and served params included."""
  config, straight, _ = probe_run
  resumed = str(tmp_path)
  run_stopped_and_resumed(config, resumed, monkeypatch, 3)
  expected, _ = latest_state(straight, config)
  state, _ = latest_state(resumed, config)
  jax.tree.map(np.testing.assert_array_equal, state, expected)
  assert logged(resumed) == logged(straight)


def test_the_probe_normalises_as_torch_batchnorm1d_does(digits_data_dir):
  """Training: the batch's mean and biased variance over the rows that
  count; the running ones after a step: 0.9 old + 0.1 the batch's, with
  the unbiased variance; a config that trains more than the head is
  refused."""
  config = small_config(digits_data_dir, **PROBE)
  keys = settings.of(config)
  probe = objectives.of(keys)(keys, 10)
  rng = np.random.default_rng(0)
  features = rng.normal(2.0, 3.0, (6, 5)).astype(np.float32)
  mask = np.array([1, 1, 1, 0, 1, 1], np.float32)
  weights = mask / mask.sum()
  params = {"head": {"kernel": np.eye(5, dtype=np.float32),
                     "bias": np.zeros(5, np.float32)}}
  micro = {"features": features, "target": np.zeros(6, np.int32)}
  kept = features[mask == 1]
  normalised = (features - kept.mean(0)) / np.sqrt(kept.var(0) + 1e-6)
  np.testing.assert_allclose(
      probe.loss(params, micro, weights, None)[0],
      (weights * -jax.nn.log_softmax(normalised)[:, 0]).sum(), rtol=1e-5)
  carry = {"mean": np.full(5, 1.0, np.float32),
           "var": np.full(5, 4.0, np.float32)}
  updated = probe.update_carry(carry, probe.observe(micro, weights), 0,
                               None)
  np.testing.assert_allclose(updated["mean"], 0.9 + 0.1 * kept.mean(0),
                             rtol=1e-5)
  np.testing.assert_allclose(updated["var"], 3.6 + 0.1 * kept.var(0, ddof=1),
                             rtol=1e-5)
  config.optimizer.frozen = "Transformer/.*"
  with pytest.raises(errors.ConfigError, match="config.optimizer.frozen"):
    objectives.of(settings.of(config)).check(settings.of(config))


def test_lars_steps_as_maes_lars_does():
  """facebookresearch/mae's LARS: weight decay and the trust ratio on
  matrices only (1 where a norm is 0), momentum, then the learning rate."""
  opt = settings.Optimizer(name="lars", learning_rate=0.5, decay="cosine",
                           weight_decay=0.1, momentum=0.9)
  tx, schedule = optimizer.create(opt, total_steps=10)
  rng = np.random.default_rng(0)
  params = {"head": {"kernel": rng.normal(size=(4, 3)).astype(np.float32),
                     "bias": rng.normal(size=3).astype(np.float32)}}
  state = tx.init(params)
  expected = jax.tree.map(np.copy, params)
  momentum = jax.tree.map(np.zeros_like, params)
  for step in range(3):
    grads = jax.tree.map(
        lambda p: rng.normal(size=p.shape).astype(np.float32), params)
    updates, state = tx.update(grads, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    for name in ("kernel", "bias"):
      p, g = expected["head"][name], grads["head"][name]
      if p.ndim > 1:
        g = g + 0.1 * p
        g = g * 0.001 * np.linalg.norm(p) / np.linalg.norm(g)
      momentum["head"][name] = 0.9 * momentum["head"][name] + g
      expected["head"][name] = p - float(schedule(step)) * momentum[
          "head"][name]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5),
                 params, expected)


def test_a_naflex_batch_is_masked_over_each_images_own_patches():
  """A NaFlex batch of one square grid computes as the images do; padding
  changes nothing; an image of a smaller grid keeps its own quarter."""
  keys = settings.of(small_config("", **MAE))
  model = mae_objective.model_of(keys)
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
  noise = rng.random((2, 16)).astype(np.float32)
  params = model.init(jax.random.key(0), images, train=False)["params"]
  apply = lambda inputs, noise: model.apply({"params": params}, inputs,
                                           train=False, noise=noise)
  pixels = mae.patchify(images, 2)
  square = apply(images, noise)
  grid = np.full((2, 2), 4, np.int32)
  flexible = apply(naflex.Patches(pixels, grid), noise)
  np.testing.assert_array_equal(flexible[1], square[1])
  np.testing.assert_allclose(flexible[0], square[0], rtol=1e-5, atol=1e-5)
  # Padded to 20 slots (K 5 where each image keeps 4): as before.
  padded = apply(naflex.Patches(np.pad(pixels, ((0, 0), (0, 4), (0, 0))),
                                grid),
                 np.pad(noise, ((0, 0), (0, 4)), constant_values=0.0))
  np.testing.assert_array_equal(padded[1][:, 16:], 0)
  np.testing.assert_array_equal(padded[1][:, :16], square[1])
  np.testing.assert_allclose(padded[0][:, :16], flexible[0], rtol=1e-5,
                             atol=1e-5)
  # Image 1 as a 2 x 4 grid in a batch of 16 slots: it keeps 2 of its 8,
  # and predicts as it does alone.
  small = pixels[1, :8]
  mixed = apply(naflex.Patches(np.stack([pixels[0], np.pad(small, (
      (0, 8), (0, 0)))]), np.array([[4, 4], [2, 4]], np.int32)), noise)
  assert mixed[1][1].sum() == 6 and mixed[1][1, 8:].sum() == 0
  alone = apply(naflex.Patches(small[None], np.array([[2, 4]], np.int32)),
                noise[1:, :8])
  np.testing.assert_array_equal(mixed[1][1, :8], alone[1][0])
  np.testing.assert_allclose(mixed[0][1, :8], alone[0][0], rtol=1e-5,
                             atol=1e-5)


def test_an_mae_run_on_naflex_batches_trains_and_holds_out(
    digits_data_dir, tmp_path):
  config = small_config(digits_data_dir, **{
      **MAE, "naflex.max_num_patches": 20, "total_steps": 6,
      "checkpoint_every": 6,
      "evaluators": {"test": {"kind": "loss", "every": 6,
                              "split": "test"}}})
  last = run_training(config, str(tmp_path))
  losses = logged(str(tmp_path))
  assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]
  assert 0 < last["test_loss"] < 2 and last["test_examples"] == 360
