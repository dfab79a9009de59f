"""Optimizers and learning-rate schedules from `config.optimizer`.

Pre-training (Table 3): Adam b1=0.9 b2=0.999, decoupled weight decay, linear
warm-up then linear or cosine decay. Fine-tuning (Table 4): SGD with momentum
0.9, cosine decay, no weight decay, gradients clipped at global norm 1.
"""

import jax
import jax.numpy as jnp
import optax

from vit_jax import errors


def learning_rate_schedule(base_lr, total_steps, warmup_steps, decay):
  """Linear warm-up from 0 to base_lr, then `decay` ("linear" or "cosine") to 0."""
  if decay not in ("linear", "cosine"):
    raise errors.InputError(
        f"config.optimizer.decay must be 'linear' or 'cosine', "
        f"got {decay!r}")
  if not 0 <= warmup_steps < total_steps:
    raise errors.InputError(
        f"config.optimizer.warmup_steps ({warmup_steps}) must be "
        f"below total_steps ({total_steps})")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warmup = base_lr * step / max(warmup_steps, 1)
    progress = jnp.clip((step - warmup_steps) / (total_steps - warmup_steps),
                        0.0, 1.0)
    if decay == "linear":
      decayed = base_lr * (1.0 - progress)
    else:
      decayed = base_lr * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    return jnp.where(step < warmup_steps, warmup, decayed)

  return schedule


def _is_kernel(params):
  # Weight decay on weight matrices only: not biases, norms, embeddings.
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) == "kernel", params)


def create(opt, total_steps):
  """(optax transformation, schedule) for the optimizer config `opt`."""
  schedule = learning_rate_schedule(opt.learning_rate, total_steps,
                                    opt.warmup_steps, opt.decay)
  if opt.name == "adam":
    core = [optax.scale_by_adam(b1=opt.b1, b2=opt.b2)]
    if opt.weight_decay:
      # AdamW's decoupled decay: the step subtracts lr(t) * wd * param.
      core.append(optax.add_decayed_weights(opt.weight_decay, mask=_is_kernel))
  elif opt.name == "sgd":
    if opt.weight_decay:
      raise errors.InputError(
          "config.optimizer.weight_decay must be 0 with sgd: "
          "the fine-tuning recipe uses none")
    core = [optax.trace(decay=opt.momentum)]
  else:
    raise errors.InputError(
        f"config.optimizer.name must be 'adam' or 'sgd', got "
        f"{opt.name!r}")
  clip = [optax.clip_by_global_norm(opt.grad_clip_norm)] if opt.grad_clip_norm else []
  tx = optax.chain(*clip, *core, optax.scale_by_learning_rate(schedule))
  return tx, schedule
