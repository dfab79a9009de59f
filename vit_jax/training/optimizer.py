"""Optimizers and learning-rate schedules from `config.optimizer`.

Pre-training (Table 3): Adam b1=0.9 b2=0.999, decoupled weight decay, linear
warm-up then linear or cosine decay (or, beyond the paper, warmup-stable-
decay: `wsd`); `mu_dtype` bfloat16 keeps Adam's first
moment in half the bytes (its second stays float32). Fine-tuning (Table 4):
SGD with momentum 0.9, cosine decay, no weight decay, gradients clipped at
global norm 1.

MAE's linear probe: LARS (`lars`), momentum 0.9 and no weight decay.

Muon (`muon`, training/muon.py): orthogonalised momentum on the blocks'
matrices, AdamW on the rest.

WSD (`decay="wsd"`; Zhai et al. 2022, Hu et al. 2024, Hägele et al. 2024):
the peak rate holds after the warm-up until the last `wsd_fraction` of the
steps, which decay to 0, linearly or as 1 - sqrt (Hägele et al.'s best).
The rate of a step before the decay does not depend on total_steps, so a
run restarted with more total_steps before its decay began trains as if
configured so from the start; the checkpoint of the decay's first step
(`stable_end`) is kept, to branch decays of other lengths from.

Beyond the paper, fine-tuning may also scale the learning rate per
parameter:
  - `layer_decay` d (1.0: off), BEiT's and timm's rule: the head and the
    final norm at the base rate, block i of L at d^(L - i), the embeddings
    (patch, class token, position; a hybrid's ResNet) at d^(L + 1);
  - `lr_mults`, ((regex, multiplier), ...) over parameter names such as
    "Transformer/encoderblock_3/MlpBlock_3/Dense_0/kernel", big_vision's
    lr_mults: the first match multiplies the rate (after layer_decay);
  - `frozen`, a regex: matching parameters (and those whose multiplier is 0)
    are not trained at all: no update, no optimizer state.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax import errors
from vit_jax.training import muon

FROZEN, TRAINED = "frozen", "trained"
# Adam's first moment: None keeps it in its parameter's dtype (float32).
MU_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}


DECAYS = ("linear", "cosine", "wsd")


def learning_rate_schedule(base_lr, total_steps, warmup_steps, decay,
                           wsd_fraction=0.2, wsd_shape="1-sqrt"):
  """Linear warm-up from 0 to base_lr, then `decay` ("linear" or "cosine")
  to 0, or ("wsd") base_lr until the last `wsd_fraction` of the steps
  (`stable_end`), which decay to 0 as `wsd_shape` ("linear" or "1-sqrt").
  The three numbers may be traced: the train step takes them as data
  (`schedule_numbers`), so that runs differing only in them share one
  compiled step."""
  if decay not in DECAYS:
    raise errors.InputError(
        f"config.optimizer.decay must be 'linear', 'cosine' or 'wsd', "
        f"got {decay!r}")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warmup = base_lr * step / jnp.maximum(warmup_steps, 1)
    start = (stable_end(total_steps, warmup_steps, wsd_fraction)
             if decay == "wsd" else warmup_steps)
    progress = jnp.clip((step - start) / jnp.maximum(total_steps - start, 1),
                        0.0, 1.0)
    if decay == "cosine":
      decayed = base_lr * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
    elif decay == "wsd" and wsd_shape == "1-sqrt":
      decayed = base_lr * (1.0 - jnp.sqrt(progress))
    else:  # linear, and wsd's linear
      decayed = base_lr * (1.0 - progress)
    return jnp.where(step < warmup_steps, warmup, decayed)

  return schedule


def stable_end(total_steps, warmup_steps, wsd_fraction):
  """The last step of a WSD schedule at its peak rate, from which its
  decay begins: total_steps less round(wsd_fraction * total_steps), and
  not before the warm-up ends. numpy or traced numbers alike."""
  decaying = jnp.round(wsd_fraction * jnp.asarray(total_steps, jnp.float32))
  return jnp.maximum(total_steps - decaying, warmup_steps)


def branch_step(opt, total_steps):
  """The step a WSD run's decay starts from (`stable_end`), whose
  checkpoint the run keeps; None for the other schedules, and where the
  decay takes no step."""
  if opt.decay != "wsd":
    return None
  step = int(stable_end(total_steps, opt.warmup_steps, opt.wsd_fraction))
  return step if 0 < step < total_steps else None


def schedule_numbers(opt, total_steps):
  """The schedule's numbers as the train step takes them: float32
  [learning_rate, warmup_steps, total_steps] (whole step counts are exact in
  float32 below 2**24)."""
  if not 0 <= opt.warmup_steps < total_steps:
    raise errors.InputError(
        f"config.optimizer.warmup_steps ({opt.warmup_steps}) must be "
        f"below total_steps ({total_steps})")
  return np.array([opt.learning_rate, opt.warmup_steps, total_steps],
                  np.float32)


def _is_kernel(params):
  # Weight decay on weight matrices only: not biases, norms, embeddings.
  return jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) == "kernel", params)


def parameter_name(path):
  """"Transformer/encoderblock_0/.../kernel" of a params tree path (the
  dict keys; a boxed parameter's own keys left out)."""
  return "/".join(str(k.key) for k in path
                  if isinstance(k, jax.tree_util.DictKey))


def _block(name):
  """The block a parameter belongs to: its index, "scanned" (the stacked
  blocks of scan_layers), "top" (final norm and heads) or "embedding"."""
  match = re.match(r"Transformer/encoderblock(?:_(\d+))?/", name)
  if match:
    return int(match.group(1)) if match.group(1) else "scanned"
  if name.startswith(("Transformer/encoder_norm", "pre_logits", "head",
                      "mpp_head", "dino_head", "ibot_head")):
    return "top"
  return "embedding"


def multiplier(name, shape, opt, num_layers):
  """The learning-rate multiplier of parameter `name` of `shape`: a float,
  or for the stacked blocks of scan_layers an array that broadcasts along
  their leading (layer) axis."""
  decay = opt.layer_decay
  block = _block(name)
  if block == "top":
    scale = 1.0
  elif block == "embedding":
    scale = decay ** (num_layers + 1)
  elif block == "scanned":
    layers = np.arange(shape[0])
    scale = (decay ** (num_layers - layers)).reshape(
        (-1,) + (1,) * (len(shape) - 1)).astype(np.float32)
  else:
    scale = decay ** (num_layers - block)
  for pattern, mult in opt.lr_mults:
    if re.fullmatch(pattern, name):
      return scale * mult
  return scale


def labels(params, opt, num_layers):
  """FROZEN or TRAINED for each parameter of `params`."""
  frozen = opt.frozen

  def label(path, leaf):
    name = parameter_name(path)
    if frozen and re.fullmatch(frozen, name):
      return FROZEN
    scale = multiplier(name, leaf.shape, opt, num_layers)
    return FROZEN if np.all(np.asarray(scale) == 0) else TRAINED
  return jax.tree_util.tree_map_with_path(label, params)


def scale_per_parameter(opt, num_layers):
  """Multiplies each update by its parameter's `multiplier`; stateless."""
  def update(updates, state, params=None):
    del params
    def scaled(path, update):
      scale = multiplier(parameter_name(path), update.shape, opt, num_layers)
      return update if np.all(np.asarray(scale) == 1) else (
          update * jnp.asarray(scale, update.dtype))
    return jax.tree_util.tree_map_with_path(scaled, updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                      update)


def create(opt, total_steps, num_layers=0, numbers=None):
  """(optax transformation, schedule) for the optimizer settings `opt`
  (runs/settings.py's Optimizer) of a model of `num_layers` blocks.
  `numbers`: the schedule's (`schedule_numbers`), traced inside the train
  step; by default `opt`'s and `total_steps`, as constants."""
  if numbers is None:
    numbers = schedule_numbers(opt, total_steps)
  schedule = learning_rate_schedule(numbers[0], numbers[2], numbers[1],
                                    opt.decay, opt.wsd_fraction,
                                    opt.wsd_shape)
  check_multipliers(opt)
  if opt.weight_decay_end is not None and opt.name != "adam":
    raise errors.InputError(
        f"config.optimizer.weight_decay_end is adam's (AdamW's scheduled "
        f"decay); with {opt.name!r} leave it unset")
  if opt.adam_learning_rate is not None and opt.name != "muon":
    raise errors.InputError(
        f"config.optimizer.adam_learning_rate is muon's (the rate of what "
        f"AdamW trains beside it); with {opt.name!r} leave it unset")
  if opt.name in ("adam", "muon"):
    if opt.mu_dtype not in MU_DTYPES:
      raise errors.InputError(
          f"config.optimizer.mu_dtype must be one of {', '.join(MU_DTYPES)}, "
          f"got {opt.mu_dtype!r}")
    core = [optax.scale_by_adam(b1=opt.b1, b2=opt.b2,
                                mu_dtype=MU_DTYPES[opt.mu_dtype])]
    if opt.weight_decay_end is not None:
      core.append(cosine_weight_decay(opt.weight_decay, opt.weight_decay_end,
                                      total_steps))
    elif opt.weight_decay:
      # AdamW's decoupled decay: the step subtracts lr(t) * wd * param.
      core.append(optax.add_decayed_weights(opt.weight_decay, mask=_is_kernel))
    if opt.name == "muon":  # AdamW's part is what Muon leaves.
      core = [muon.transform(opt, MU_DTYPES[opt.mu_dtype], core, _is_kernel,
                             parameter_name)]
  elif opt.name == "lars":
    core = lars(opt)
  elif opt.name == "sgd":
    if opt.weight_decay:
      raise errors.InputError(
          "config.optimizer.weight_decay must be 0 with sgd: "
          "the fine-tuning recipe uses none")
    core = [optax.trace(decay=opt.momentum)]
  else:
    raise errors.InputError(
        f"config.optimizer.name must be 'adam', 'muon', 'sgd' or 'lars', "
        f"got {opt.name!r}")
  clip = [optax.clip_by_global_norm(opt.grad_clip_norm)] if opt.grad_clip_norm else []
  # Each piece only where it is asked for: an optimizer state of another
  # structure would not restore the checkpoints of earlier runs.
  scaled = ([scale_per_parameter(opt, num_layers)]
            if opt.layer_decay != 1 or opt.lr_mults else [])
  tx = optax.chain(*clip, *core, optax.scale_by_learning_rate(schedule),
                   *scaled)
  if not opt.frozen and not any(m == 0 for _, m in opt.lr_mults):
    return tx, schedule
  # Frozen parameters get no update and, masked out of `tx`, no state.
  return optax.multi_transform(
      {TRAINED: tx, FROZEN: optax.set_to_zero()},
      lambda params: labels(params, opt, num_layers)), schedule


def cosine_weight_decay(start, end, total_steps):
  """AdamW's decoupled decay of the kernels at a rate that follows a
  cosine from `start` (step 0) to `end` (at total_steps), DINOv2's
  CosineScheduler; its state counts the steps."""
  def init(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update(updates, state, params):
    progress = state.count.astype(jnp.float32) / total_steps
    rate = end + (start - end) * 0.5 * (1 + jnp.cos(jnp.pi * progress))
    decayed = jax.tree.map(
        lambda u, p, kernel: u + rate * p if kernel else u, updates, params,
        _is_kernel(params))
    return decayed, optax.ScaleByScheduleState(count=state.count + 1)

  return optax.GradientTransformation(init, update)


# LARS's trust coefficient (You et al. 2017; facebookresearch/mae's 0.001).
LARS_TRUST_COEFFICIENT = 0.001


def lars(opt):
  """LARS as MAE's linear probe uses it: weight decay added to the
  gradient, each matrix's step scaled to trust x |param| / |step| (1 where
  either norm is 0; biases and norms as they are), then momentum; the
  learning rate multiplies the momentum, as in torch. A scanned stack of
  blocks (scan_layers) is one matrix to it."""
  decay = ([optax.add_decayed_weights(opt.weight_decay, mask=_is_kernel)]
           if opt.weight_decay else [])
  return decay + [
      optax.masked(optax.scale_by_trust_ratio(
          trust_coefficient=LARS_TRUST_COEFFICIENT),
          lambda params: jax.tree.map(lambda p: p.ndim > 1, params)),
      optax.trace(decay=opt.momentum)]


def check_multipliers(opt):
  """layer_decay, lr_mults and frozen, each error naming its key."""
  decay = opt.layer_decay
  if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not (
      0 < decay <= 1):
    raise errors.InputError(
        f"config.optimizer.layer_decay must be in (0, 1] (1: off), got "
        f"{decay!r}")
  patterns = [opt.frozen]
  try:
    for pattern, mult in opt.lr_mults:
      patterns.append(pattern)
      if isinstance(mult, bool) or not isinstance(mult, (int, float)) or (
          mult < 0):
        raise ValueError
  except (TypeError, ValueError):
    raise errors.InputError(
        f"config.optimizer.lr_mults must be pairs (regex, multiplier >= 0), "
        f"got {opt.lr_mults!r}") from None
  for pattern in patterns:
    try:
      re.compile(pattern)
    except (re.error, TypeError) as e:
      raise errors.InputError(
          f"config.optimizer: {pattern!r} is not a regular expression of "
          f"parameter names: {e}") from None
