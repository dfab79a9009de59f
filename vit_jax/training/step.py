"""The training step, and the program of jitted functions a run is built of.

`parts(settings, num_classes)` builds the objective (training/objectives/:
what the run learns, with its model) and the optimizer, once per run
(training/resolve.py keeps them in the Run); `build(settings, mesh, parts)`
makes the train state's shapes and shardings from abstract values (nothing
allocated or compiled), and jits `init` and `train_step` with explicit in
and out shardings (sharding.py's rules table). The loop (loop.py) and the
planner (vit_jax/planning) use the same program. Nothing here names an
objective.
"""

import functools
from typing import Any, Callable, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

from vit_jax import errors, sharding
from vit_jax.training import objectives, optimizer
from vit_jax.weights import pretrained


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  # What the run is evaluated and exported with, where it is not the
  # params themselves (None): their Polyak average (polyak.py), or what the
  # objective serves (objectives/base.py). Checkpoints name it "polyak".
  polyak: Any


@flax.struct.dataclass
class CarryingState(TrainState):
  """The state of an objective that keeps state of its own beside the
  params (its `init_carry`). A field of its own class, not an empty one of
  TrainState's: checkpoints saved without it still restore."""
  carry: Any


class Held(NamedTuple):
  """What an objective's `teach` may read beside a micro-batch: the
  params, the served params (TrainState.polyak), its carry and its frozen
  inputs, each None where it has none."""
  params: Any
  served: Any
  carry: Any
  frozen: Any


def init_state(objective, tx, image_size, polyak_decay, rng):
  """A fresh state whose params and moments are still in their logical boxes."""
  params = objective.init_params(rng, image_size)
  carry = objective.init_carry(params)
  fields = dict(step=jnp.zeros((), jnp.int32), params=params,
                opt_state=tx.init(params),
                polyak=objective.init_served(params, carry, polyak_decay))
  if carry is None:
    return TrainState(**fields)
  return CarryingState(**fields, carry=carry)


def abstract_state(objective, tx, image_size, polyak_decay, mesh,
                   fsdp_min_bytes=0):
  """(shapes, shardings) of the train state, without allocating it.

  This is all that compiling the train step needs, here or ahead of time for
  a TPU topology.
  """
  return sharding.sharded_shapes(
      jax.eval_shape(lambda: init_state(objective, tx, image_size,
                                        polyak_decay, jax.random.key(0))),
      mesh, fsdp_min_bytes)


def make_train_step(objective, optimizer_of, accum_steps, seed, polyak_decay,
                    unroll=False):
  """state, batch, numbers, frozen params -> state, metrics; the gradient
  of the batch's mean loss, summed over micro-batches. The `objective`
  (training/objectives/) prepares the whole batch before it is split
  (targets smoothed and mixed, masks drawn), teaches each micro-batch
  (Held: its params, served params, carry and frozen params, a teacher's
  or None) and gives the loss and what its carry observes; after the
  update it moves its carry and what it serves. The optimizer is
  `optimizer_of(numbers)`: the schedule's numbers come in as data
  (optimizer.schedule_numbers), not as constants of the compiled step; so
  do the frozen params.

  unroll: trace the micro-batch loop unrolled, for vit_jax.plan (XLA's cost
  analysis counts a loop's body once); runs keep the loop, which compiles
  one micro-step and frees each one's activations before the next.
  """

  def loss_and_grads(params, micro, weights, key, held):
    """((loss, {part: value}), grads, observed) of a batch or micro-batch;
    observed: what the objective's carry learns from it (weighted sums)."""
    micro = objective.teach(held, micro)
    (loss, parts), grads = jax.value_and_grad(
        lambda params: objective.loss(params, micro, weights, key),
        has_aux=True)(params)
    return (loss, parts), grads, objective.observe(micro, weights)

  def train_step(state, batch, numbers, frozen):
    counts = {key: batch[key] for key in ("broken", "dropped") if key in batch}
    packed = "segments" in batch
    tx, schedule = optimizer_of(numbers)
    dropout_key = jax.random.fold_in(jax.random.key(seed), state.step)
    batch = objective.prepare(batch, state.step)
    carry = getattr(state, "carry", None)
    held = Held(state.params, state.polyak, carry, frozen)
    # The mean over the batch's examples, without the rows whose image did
    # not decode (mask 0, broken_records.py), nor a packed batch's empty
    # slots: each example weighs 1 / count.
    mask = batch["mask"]
    weights = mask / jnp.maximum(mask.sum(), 1)
    if accum_steps == 1:
      (loss, parts), grads, observed = loss_and_grads(
          state.params, batch, weights, dropout_key, held)
    else:
      # Micro-batch i takes examples i, i + A, i + 2A, ...: each device's
      # rows stay on that device, so splitting needs no communication.
      strided = jax.tree.map(
          lambda x: x.reshape(x.shape[0] // accum_steps, accum_steps,
                              *x.shape[1:]), {**batch, "weight": weights})

      def micro_batch(i):
        return jax.tree.map(lambda x: x[:, i], strided)

      def accumulate(sums, i):
        micro = micro_batch(i)
        (loss, parts), grads, observed = loss_and_grads(
            state.params, micro, micro["weight"],
            jax.random.fold_in(dropout_key, i), held)
        return jax.tree.map(jnp.add, sums, (loss, parts, grads, observed)), None

      (_, parts), _, observed = jax.eval_shape(
          loss_and_grads, state.params, micro_batch(0),
          micro_batch(0)["weight"], dropout_key, held)
      zeros = (jnp.zeros((), jnp.float32),
               jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), parts),
               jax.tree.map(jnp.zeros_like, state.params),
               jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), observed))
      # Weighted sums over the micro-batches add up to the batch's mean.
      (loss, parts, grads, observed), _ = jax.lax.scan(
          accumulate, zeros, jnp.arange(accum_steps), unroll=unroll)

    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"train_loss": loss, "learning_rate": schedule(state.step),
               "grad_norm": optax.tree.norm(grads),
               **(packing_metrics(batch, counts) if packed else
                  {"skipped_examples": (mask == 0).sum()}), **parts}
    fields = {}
    if carry is not None:
      carry = fields["carry"] = objective.update_carry(
          carry, observed, state.step, state.polyak)
    served = objective.update_served(state.polyak, params, carry,
                                     polyak_decay, state.step)
    return state.replace(step=state.step + 1, params=params,
                         opt_state=opt_state, polyak=served,
                         **fields), metrics

  return train_step


def packing_metrics(batch, counts):
  """A packed batch's (data/packing.py): its images, the share of its
  patch slots that hold none, the share of the images read that found no
  room, and the images that did not decode."""
  images = batch["mask"].sum()
  dropped = counts["dropped"].sum()
  return {"skipped_examples": counts["broken"].sum(),
          "images_per_step": images,
          "padding_fraction": (batch["segments"] == 0).mean(),
          "dropped_fraction": dropped / jnp.maximum(images + dropped, 1)}


class Parts(NamedTuple):
  """What a run's program is built of, each built once (`parts`)."""
  objective: Any  # what it learns (training/objectives/), its model
  tx: optax.GradientTransformation  # for the state's structure
  numbers: np.ndarray    # the schedule's (optimizer.schedule_numbers)
  optimizer_of: Callable  # numbers -> (tx, schedule), for the train step

  @property
  def model(self):
    return self.objective.model


def parts(settings, num_classes, frozen=None):
  """The objective (with its model) and the optimizer of a run's
  `settings` (runs/settings.py), for `num_classes` classes, with its
  `frozen` inputs (the objective's `load`, read once: a teacher); an
  InputError naming the key where its model (a ConfigError) or its
  optimizer cannot be built."""
  try:
    objective = objectives.of(settings)(settings, num_classes, frozen)
  except errors.InputError as e:
    raise errors.ConfigError.of(e, "config.model") from e
  numbers = optimizer.schedule_numbers(settings.optimizer,
                                       settings.total_steps)
  optimizer_of = functools.partial(optimizer.create, settings.optimizer,
                                   settings.total_steps,
                                   objective.model.config.num_layers)
  tx, _ = optimizer_of(numbers)
  return Parts(objective, tx, numbers, optimizer_of)


class Program(NamedTuple):
  """The jitted functions of a run and the shapes and shardings they take."""
  model: nn.Module
  state_shapes: Any      # ShapeDtypeStructs carrying their shardings
  state_shardings: Any
  batch_sharding: NamedSharding
  init: Callable         # rng -> sharded TrainState
  train_step: "BoundStep"  # state, batch -> state, metrics (state donated)
  frozen: Any = None     # the objective's frozen inputs over the mesh (a
  #                        distill.OnMesh), where it has any
  serve: Callable = None  # params, carry -> the served params of a state
  #                        whose params were read (initial_state)


class BoundStep:
  """The jitted train step with its schedule's numbers and its frozen
  params bound: called, and lowered, with (state, batch). The numbers go in
  as a replicated array, placed once; the frozen inputs' (an OnMesh, or
  None) as they place them."""

  def __init__(self, jitted, numbers, mesh, frozen=None):
    self._jitted = jitted
    self._numbers = numbers
    self._sharding = sharding.replicated(mesh)
    self._placed = None
    self._frozen = frozen

  def numbers_on_devices(self):
    """The numbers, replicated over the mesh (placed on the first call)."""
    if self._placed is None:
      # As the batches are placed: in a pod each process gives its copy.
      self._placed = sharding.to_global({"numbers": self._numbers},
                                        self._sharding)["numbers"]
    return self._placed

  def __call__(self, state, batch):
    return self._jitted(state, batch, self.numbers_on_devices(),
                        self._frozen and self._frozen.params())

  def lower(self, state, batch):
    return self._jitted.lower(state, batch, jax.ShapeDtypeStruct(
        self._numbers.shape, self._numbers.dtype, sharding=self._sharding),
                              self._frozen and self._frozen.shapes)


def build(settings, mesh, built, unroll=False):
  """Builds the program of a run's `settings` and its Parts `built` from
  abstract shapes only: nothing is allocated or compiled until it is first
  called (or lowered, for a TPU topology). `unroll`: see make_train_step."""
  objective, tx = built.objective, built.tx
  state_shapes, state_shardings = abstract_state(
      objective, tx, settings.image_size, settings.polyak_decay, mesh,
      settings.mesh.fsdp_min_bytes)
  batch_shard = sharding.batch_sharding(mesh)
  frozen = objective.frozen and objective.frozen.on_mesh(
      mesh, settings.mesh.fsdp_min_bytes)
  init = jax.jit(
      lambda rng: nn.meta.unbox(init_state(objective, tx, settings.image_size,
                                           settings.polyak_decay, rng)),
      out_shardings=state_shardings)
  train_step = jax.jit(
      sharding.constrained(
          make_train_step(objective, built.optimizer_of,
                          settings.accum_steps, settings.seed,
                          settings.polyak_decay, unroll), mesh),
      in_shardings=(state_shardings, batch_shard, sharding.replicated(mesh),
                    frozen and frozen.shardings),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0)
  # Copied: what is served holds buffers of its own, even where it starts
  # as the params themselves.
  serve = jax.jit(
      lambda params, carry: jax.tree.map(jnp.copy, objective.init_served(
          params, carry, settings.polyak_decay)),
      out_shardings=state_shardings.polyak)
  return Program(objective.model, state_shapes, state_shardings, batch_shard,
                 init, BoundStep(train_step, built.numbers, mesh, frozen),
                 frozen, serve)


def initial_params(program, settings):
  """A new run's params from init_from, read and adapted to the program's
  model as host arrays (pretrained.initial_params: a ConfigError where they
  cannot fit), or None where it sets none. Nothing is compiled or
  written."""
  if not settings.init_from:
    return None
  return pretrained.initial_params(settings.init_from,
                                   program.state_shapes.params,
                                   program.model.config.num_heads,
                                   settings.dataset)


def initial_state(program, settings, adapted=None):
  """A new run's state: fresh, with params from init_from if set (as
  `initial_params` gives them: `adapted` where read already, else read
  now, before anything is compiled)."""
  if adapted is None:
    adapted = initial_params(program, settings)
  state = program.init(jax.random.key(settings.seed))
  if adapted is None:
    return state
  params = pretrained.place(adapted, state.params,
                            program.state_shardings.params)
  # What is served starts from the same values, in buffers of its own: the
  # train step donates the state, and one buffer donated twice crashes XLA.
  return state.replace(params=params, polyak=None if state.polyak is None
                       else program.serve(params, getattr(state, "carry",
                                                          None)))
