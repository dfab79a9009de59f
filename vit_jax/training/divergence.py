"""Why a run's loss turned NaN or infinite, told from its numbers.

The loop stops at a non-finite loss before saving anything of that step
(`Diverged`). What the user should do next depends on where the numbers
went wrong, which `explain` reads from the workdir:

- A blow-up: the params had grown before the loss gave out. The newest
  checkpoint holds values no healthy ViT has (beyond HEALTHY_LIMIT, or not
  finite), or the gradient norms logged climbed. Resuming would replay it,
  and a lower learning rate is a new config, which the workdir refuses: the
  way on is a new workdir that starts from the newest checkpoint whose
  params are sane (init_from=WORKDIR:STEP) with a lower rate.
- A sudden divergence: the newest checkpoint is sane (and its fingerprints
  held when it was read, so the restore was faithful) but the steps since
  diverged: the same restart from it, with a lower rate, a longer warm-up or
  a gradient clip.
"""

import json
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import errors
from vit_jax.runs import checkpoints

# Params of trained ViTs stay within a few tens (LayerNorm scales are the
# largest); one of this size has been thrown out by a blow-up.
HEALTHY_LIMIT = 1e4
# A logged gradient norm this many times the run's median for the steps
# before the loss gave out marks a climb.
CLIMB = 100.0


class Diverged(errors.RunError):
  """The loss of `step` is `loss` (not finite); `resumed_at`: the step this
  run resumed from, if it did. `explain` says why."""

  def __init__(self, step, loss, resumed_at):
    super().__init__(f"train_loss is {loss} at step {step}")
    self.step, self.loss, self.resumed_at = step, loss, resumed_at


def explain(run, program, diverged):
  """The one-paragraph RunError message for `diverged` in `run`: what the
  numbers show and how to go on. Reads the kept checkpoints (newest first,
  until a sane one) and metrics.jsonl; writes nothing."""
  # The frames of the failed loop hold its state: let it go first.
  traceback.clear_frames(diverged.__traceback__)
  step, workdir = diverged.step, run.workdir
  said = [f"train_loss is {diverged.loss} at step {step}: stopped before "
          "saving any state of that step."]
  climb = _grad_norm_climb(workdir, step)
  reader = workdir.checkpoint_reader()
  try:
    kept = sorted(reader.all_steps(), reverse=True)
    sane, blown = None, []
    for saved in kept:
      largest = _largest_param(reader, saved, program.state_shapes)
      if largest is not None and largest <= HEALTHY_LIMIT:
        sane = (saved, largest)
        break
      blown.append((saved, largest))
  finally:
    reader.close()
  if blown:
    saved, largest = blown[0]
    holds = ("values that are not finite" if largest is None or
             not np.isfinite(largest) else f"params up to {largest:.1e}")
    said.append(f"The run blew up before it: the checkpoint of step {saved} "
                f"already holds {holds} (a healthy ViT's stay below "
                f"{HEALTHY_LIMIT:.0e}){climb}, so resuming would replay it.")
  elif sane is not None:
    saved, largest = sane
    since = ("it resumed from" if diverged.resumed_at == saved
             else "it saved last")
    said.append(f"The checkpoint of step {saved} that {since} is sane "
                f"(params up to {largest:.2g}, all finite, as saved): the "
                f"{step - saved} steps since diverged{climb}.")
  elif climb:
    said.append(f"No checkpoint was saved yet{climb}.")
  rate = run.settings.optimizer.learning_rate
  lower = (f"--config.optimizer.learning_rate={rate / 10:.3g} or lower, a "
           "longer optimizer.warmup_steps or optimizer.grad_clip_norm")
  if sane is not None:
    said.append(f"Go on from step {sane[0]} in a new --workdir with "
                f"--config.init_from={workdir}:{sane[0]} and {lower} (this "
                "workdir keeps the config it was started with).")
  else:
    said.append(f"Start again in a new --workdir with {lower} (this workdir "
                "keeps the config it was started with).")
  return " ".join(said)


def _largest_param(reader, step, state_shapes):
  """The largest |value| of the params saved at `step` (inf when one is
  not finite), or None when the checkpoint does not read whole."""
  restored = checkpoints.restore_if_whole(reader, step, state_shapes)
  if restored is None:
    return None
  state, _ = restored
  largest = max(float(jnp.max(jnp.abs(x)))
                for x in jax.tree.leaves(state.params))
  return largest if np.isfinite(largest) else float("inf")


def _grad_norm_climb(workdir, step):
  """', and grad_norm climbed from A to B at step N' when the last
  gradient norm logged before `step` is CLIMB times the run's median, or
  not finite; else ''."""
  logged = []
  for line in workdir.metrics_lines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if "grad_norm" in row and row.get("step", step) < step:
      logged.append((row["step"], row["grad_norm"]))
  if len(logged) < 2:
    return ""
  median = float(np.median([norm for _, norm in logged[:-1]]))
  last_step, last = logged[-1]
  if np.isfinite(last) and last < CLIMB * median:
    return ""
  return (f", and grad_norm climbed from a median of {median:.2g} to "
          f"{last:.2g} at step {last_step}")
