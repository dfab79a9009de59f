"""train_and_evaluate(config, workdir): the training loop, start to end.

An image goes: TFDS record -> input_pipeline (per-process batch) ->
`to_global` (one jax.Array over the mesh) -> `train_step` (jit with explicit
shardings, donated state) -> metrics.jsonl / TensorBoard, with the state
saved by orbax every `checkpoint_every` steps.
"""

import os
from typing import Any, Callable, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from clu import parameter_overview

from vit_jax import (broken_images, checkpoint, compute, elastic, errors,
                     evaluators, input_pipeline, models, optim, polyak,
                     preemption, preprocess, pretrained,
                     progress as progress_lib, sharding, timing, writers)
from vit_jax import workdir as workdir_lib

@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  polyak: Any  # The params' moving average, or None (vit_jax/polyak.py).


def create_model(config, num_classes):
  overrides = config.model.to_dict()
  return models.create(overrides.pop("name"), num_classes, **overrides)


def init_state(model, tx, image_size, polyak_decay, rng):
  """A fresh state whose params and moments are still in their logical boxes."""
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  params = model.init(rng, images, train=False)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=tx.init(params),
                    polyak=polyak.init(params, polyak_decay))


def abstract_state(model, tx, image_size, polyak_decay, mesh):
  """(shapes, shardings) of the train state, without allocating it.

  This is all that compiling the train step needs, here or ahead of time for
  a TPU topology.
  """
  boxed = jax.eval_shape(lambda: init_state(model, tx, image_size,
                                            polyak_decay, jax.random.key(0)))
  shardings = sharding.tree_shardings(boxed, mesh)
  shapes = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      nn.meta.unbox(boxed), shardings)
  return shapes, shardings


def make_train_step(model, tx, schedule, accum_steps, seed, polyak_decay,
                    unroll=False):
  """state, batch -> state, metrics; the gradient of the batch's mean loss,
  summed over micro-batches.

  unroll: trace the micro-batch loop unrolled, for vit_jax.plan (XLA's cost
  analysis counts a loop's body once); runs keep the loop, which compiles
  one micro-step and frees each one's activations before the next.
  """

  def loss_and_grads(params, batch, weights, key):
    return jax.value_and_grad(model.loss)(params, batch["image"],
                                          batch["label"], weights, key)

  def train_step(state, batch):
    dropout_key = jax.random.fold_in(jax.random.key(seed), state.step)
    # The mean over the batch's examples, without the rows whose image did
    # not decode (mask 0, broken_images.py): each example weighs 1 / count.
    mask = batch["mask"]
    weights = mask / jnp.maximum(mask.sum(), 1)
    if accum_steps == 1:
      loss, grads = loss_and_grads(state.params, batch, weights, dropout_key)
    else:
      # Micro-batch i takes examples i, i + A, i + 2A, ...: each device's
      # rows stay on that device, so splitting needs no communication.
      strided = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // accum_steps, accum_steps,
                              *x.shape[1:]), {**batch, "weight": weights})

      def accumulate(carry, i):
        micro = jax.tree.map(lambda x: x[:, i], strided)
        loss, grads = loss_and_grads(state.params, micro, micro["weight"],
                                     jax.random.fold_in(dropout_key, i))
        return jax.tree.map(jnp.add, carry, (loss, grads)), None

      zeros = (jnp.zeros((), jnp.float32),
               jax.tree.map(jnp.zeros_like, state.params))
      # Weighted sums over the micro-batches add up to the batch's mean.
      (loss, grads), _ = jax.lax.scan(accumulate, zeros,
                                      jnp.arange(accum_steps), unroll=unroll)

    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"train_loss": loss, "learning_rate": schedule(state.step),
               "grad_norm": optax.tree.norm(grads),
               "skipped_examples": (mask == 0).sum()}
    average = polyak.update(state.polyak, params, polyak_decay)
    return TrainState(state.step + 1, params, opt_state, average), metrics

  return train_step


def check_config(config, mesh):
  """Refuses a config that cannot run, with one message, before compiling."""
  check_program(config, mesh)
  try:  # Data problems surface now, not at the first evaluation.
    preprocess.check_crop_fraction(config.eval_crop_fraction)
    preprocess.parse_augmentations(config.augment)
    input_pipeline.num_examples(config.dataset, config.train_split,
                                config.data_dir)
    input_pipeline.check_broken_images(config.dataset, config.data_dir,
                                       config.broken_images)
    evaluators.check(config)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e


def check_program(config, mesh):
  """The checks that need no data: enough to build and compile the step
  (vit_jax.plan does only these)."""
  try:
    model = create_model(config, num_classes=1)
  except ValueError as e:
    raise errors.ConfigError(f"config.model: {e}") from e
  data_parallel = sharding.data_parallel_size(mesh)
  per_step = data_parallel * config.accum_steps
  if config.batch_size % per_step:
    raise errors.ConfigError(
        f"config.batch_size={config.batch_size} is not divisible by the "
        f"{data_parallel} data-parallel devices (mesh data={mesh.shape['data']}"
        f" x fsdp={mesh.shape['fsdp']}) times accum_steps={config.accum_steps}")
  if config.model.get("mpp") and evaluators.enabled_names(config):
    raise errors.ConfigError(
        f"config.model.mpp pre-trains without labels, but evaluators "
        f"{evaluators.enabled_names(config)} would classify: set their "
        "`every` to 0 (configs/mpp.py does)")
  if config.image_size % model.token_stride:
    raise errors.ConfigError(f"config.model {model.describe_patch()} does not "
                             f"divide config.image_size={config.image_size}")
  for key in ("total_steps", "accum_steps", "log_every", "checkpoint_every"):
    if config[key] < 1:
      raise errors.ConfigError(f"config.{key} must be >= 1, got {config[key]}")
  if not 0 <= config.polyak_decay < 1:
    raise errors.ConfigError(f"config.polyak_decay must be in [0, 1), got "
                             f"{config.polyak_decay}")


class Program(NamedTuple):
  """The jitted functions of a run and the shapes and shardings they take."""
  model: nn.Module
  state_shapes: Any      # ShapeDtypeStructs carrying their shardings
  state_shardings: Any
  batch_sharding: NamedSharding
  init: Callable         # rng -> sharded TrainState
  train_step: Callable   # state, batch -> state, metrics (state donated)


def build(config, mesh, num_classes, unroll=False):
  """Builds the run's program from abstract shapes only: nothing is allocated
  or compiled until it is first called (or lowered, for a TPU topology).
  `unroll`: see make_train_step."""
  model = create_model(config, num_classes)
  tx, schedule = optim.create(config.optimizer, config.total_steps)
  state_shapes, state_shardings = abstract_state(
      model, tx, config.image_size, config.polyak_decay, mesh)
  batch_shard = sharding.batch_sharding(mesh)
  init = jax.jit(
      lambda rng: nn.meta.unbox(init_state(model, tx, config.image_size,
                                           config.polyak_decay, rng)),
      out_shardings=state_shardings)
  train_step = jax.jit(
      sharding.constrained(
          make_train_step(model, tx, schedule, config.accum_steps,
                          config.seed, config.polyak_decay, unroll), mesh),
      in_shardings=(state_shardings, batch_shard),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0)
  return Program(model, state_shapes, state_shardings, batch_shard, init,
                 train_step)


def initial_state(program, config):
  """A new run's state: fresh, with params from config.init_from if set."""
  adapted = None
  if config.init_from:  # Read and checked before anything is compiled.
    adapted = pretrained.initial_params(config.init_from,
                                        program.state_shapes.params,
                                        program.model.num_heads)
  state = program.init(jax.random.key(config.seed))
  if adapted is None:
    return state
  params = pretrained.place(adapted, state.params,
                            program.state_shardings.params)
  # The average starts from the same values, in buffers of its own: the
  # train step donates the state, and one buffer donated twice crashes XLA.
  return state.replace(params=params, polyak=None if state.polyak is None
                       else jax.tree.map(jnp.copy, params))


def ensure_finite(metrics, step):
  """Stops the run at a non-finite loss, before anything of it is saved."""
  loss = float(metrics["train_loss"])
  if not np.isfinite(loss):
    raise errors.RunError(
        f"train_loss is {loss} at step {step}: stopped before saving any "
        "state of that step, so the workdir keeps its last good checkpoint. "
        "A lower optimizer.learning_rate, a longer warm-up or "
        "optimizer.grad_clip_norm may help.")


def resume_or_start(manager, program, config):
  """(state, progress, whether it resumed): the latest checkpoint's, or a
  new run's. progress: training seconds and skipped examples so far."""
  restored = checkpoint.restore_latest(manager, program.state_shapes)
  if restored:
    state, progress = restored
    return state, {"skipped_examples": 0, **progress}, True
  return (initial_state(program, config),
          {"train_seconds": 0.0, "skipped_examples": 0}, False)


def train_batches(config, mesh, start_step):
  """This process's share of each global batch, from `start_step` on; the
  log names the first broken images (broken_images.named)."""
  batches = input_pipeline.train_dataset(
      config.dataset, config.train_split, batch_size=config.batch_size,
      image_size=config.image_size, augment=config.augment, seed=config.seed,
      start_step=start_step,
      shares=elastic.process_shares(mesh, config.input_shares),
      num_shares=config.input_shares,
      data_dir=config.data_dir).as_numpy_iterator()
  return broken_images.named(batches, f"{config.dataset} "
                             f"{config.train_split}", config.broken_images)


def due(step, every, last_step):
  return step % every == 0 or step == last_step


def train_and_evaluate(config, workdir):
  """Trains `config` in `workdir`, resuming from its latest checkpoint.

  Returns the last metrics written (the evaluators' last results and
  `core_days` among them), and `stopped_at_step` when a signal stopped the
  run early.
  """
  # A fine-tune computes its source's function; config.json records it.
  config = pretrained.with_function(config, workdir)
  mesh = sharding.make_mesh(config.mesh)
  check_config(config, mesh)
  # The same batches on any slice this run moves to: config.json records it.
  config = elastic.with_input_shares(config, workdir, mesh)
  num_classes = input_pipeline.num_classes(config.dataset, config.data_dir)
  program = build(config, mesh, num_classes)
  changes = workdir_lib.check(config, workdir)  # Before anything is written.
  manager = checkpoint.manager(os.path.join(workdir, checkpoint.SUBDIR),
                               config.keep_checkpoints)
  state, progress, resumed = resume_or_start(manager, program, config)
  changes.update(elastic.moved(progress, mesh))
  workdir_lib.record(config, workdir, changes)
  evaluate = evaluators.Evaluators(config, program)
  start_step, total = int(state.step), config.total_steps
  writer = writers.create(workdir, start_step)
  parameter_overview.log_parameter_overview(
      program.state_shapes.params, include_stats=False,
      msg=f"{config.model.name}, params sharded over mesh {dict(mesh.shape)}")
  batches = train_batches(config, mesh, start_step)
  printer = progress_lib.Progress(total, start_step, config.batch_size,
                                  config.log_every,
                                  enabled=jax.process_index() == 0)
  printer.say(progress_lib.describe_run(config, mesh, workdir, start_step,
                                         resumed))
  clock = timing.RunClock(progress["train_seconds"], jax.device_count())
  skipped = broken_images.Count(progress["skipped_examples"])
  window = timing.Window(config.batch_size, jax.device_count(),
                         compute.Throughput(config, num_classes))
  last, previous = {}, None
  try:
    with preemption.StopRequest() as stop_requested:
      for step in range(start_step + 1, total + 1):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
          batch = input_pipeline.to_global(next(batches),
                                           program.batch_sharding)
          state, metrics = program.train_step(state, batch)
        # Waiting for the previous step keeps at most one step queued behind
        # the running one: the CPU runtime deadlocks its collectives when
        # many are queued, and on TPU one queued step hides the dispatch.
        if previous is not None:
          ensure_finite(previous, step - 1)
        previous = metrics
        skipped.add(metrics.pop("skipped_examples"))
        window.add(metrics, compiled=step == start_step + 1)
        stopping = stop_requested(step)
        log_now = stopping or due(step, config.log_every, total)
        save_now = stopping or due(step, config.checkpoint_every, total)
        if log_now or save_now or evaluate.any_due(step):
          ensure_finite(metrics, step)
        row = window.row() if log_now else {}
        if log_now:
          row["train_skipped_examples"] = skipped.total()
        printer.step(step, lambda: float(metrics["train_loss"]))
        with window.paused():  # Evaluation and saving are not steps.
          results = evaluate.run_due(step, polyak.eval_params(state))
          printer.results(step, results)
          row.update(results)
          if row:  # One row per step: metrics.jsonl has each value once.
            row["core_days"] = clock.core_days()
            writer.write_scalars(step, row)
            last.update(row)
          if save_now:
            checkpoint.save(manager, step, state,
                            {"train_seconds": clock.seconds(),
                             "skipped_examples": skipped.total(),
                             "mesh": dict(mesh.shape)})
        checkpoint.check_saves(manager)  # A failed save stops the run now.
        if stopping:
          last["stopped_at_step"] = step
          break
  finally:
    # Even when a step fails, the save under way completes: the run
    # resumes from it rather than from an older step.
    checkpoint.finish(manager)
    writer.flush()
  if not last:  # Already finished in an earlier run: report, do not train.
    last = {**evaluate.run_all(polyak.eval_params(state)),
            "core_days": clock.core_days()}
  return last
