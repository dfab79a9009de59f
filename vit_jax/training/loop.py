"""train_and_evaluate(run): the training loop, start to end.

An image goes: TFDS record -> data/pipeline.py (per-process batch) ->
sharding.to_global (one jax.Array over the mesh) -> step.py's `train_step`
(jit with explicit shardings, donated state) -> metrics.jsonl / TensorBoard
(reporting/), with the state saved by orbax every `checkpoint_every` steps
(runs/checkpoints.py). The run comes resolved (resolve.py).
"""

import jax
import numpy as np

from vit_jax import errors, sharding
from vit_jax.data import broken_records, packing, pipeline, shares
from vit_jax.runs import checkpoints, store
from vit_jax.training import (
  divergence,
  evaluators,
  optimizer,
  polyak,
  preemption,
  profiling,
  reporting,
  step as step_lib,
)
from vit_jax.training.reporting import goodput, timing


def train_and_evaluate(run, started=None):
  """Trains the resolved `run`, resuming from its workdir's latest
  checkpoint, while it holds the workdir (runs/lock.py). Returns the last
  metrics written (the evaluators' last results, `core_days` and the
  buckets of `time` among them), and `stopped_at_step` when a signal
  stopped the run early. A run already finished is only evaluated and
  reported, writing nothing, so a read-only copy of its workdir serves too.
  `started`: when the run began (time.time()), for its startup time;
  default now."""
  accounts = goodput.Accounts(since=started)
  try:
    program = step_lib.build(run.settings, run.mesh, run.parts)
    finished = report_finished(run, program)
    if finished is not None:
      return finished
    # A new run's init_from is read, and refused where it cannot fit,
    # before anything is written in the workdir (its lock, its checkpoints'
    # folder); a run that resumes reads its own checkpoint instead.
    adapted = (None if run.workdir.checkpoint_steps()
               else step_lib.initial_params(program, run.settings))
    with run.workdir.lock(run.settings.wait_for_lock):
      try:
        return train(run, program, accounts, adapted)
      except divergence.Diverged as e:
        raise errors.RunError(divergence.explain(run, program, e)) from None
  finally:
    accounts.close()


def train(run, program, accounts, adapted=None):
  """The loop itself: steps, evaluations and saves from the latest step;
  `adapted`: a new run's params from init_from (step.initial_params), where
  read already."""
  keys = run.settings
  total = keys.total_steps
  # A WSD run keeps the checkpoint its decay starts from, to branch from.
  branch = optimizer.branch_step(keys.optimizer, total)
  manager = run.workdir.checkpoint_manager(
      keys.keep_checkpoints, preserve=() if branch is None else (branch,))
  state, saved, resumed = resume_or_start(manager, program, keys, accounts,
                                          adapted)
  store.record(keys, run.workdir, {
      **run.changes, **store.devices_change(saved.get("mesh"), run.mesh)})
  evaluate = evaluators.Evaluators(run, program)
  start_step = int(state.step)
  accounts.carry(goodput.carried(goodput.saved(saved), start_step,
                                 goodput.read_record(run.workdir)))
  restored_at = start_step if resumed else None  # For ensure_finite's advice.
  report = reporting.Report(run, program, start_step, saved, resumed,
                            accounts)
  batches = train_batches(run, start_step)
  trace = profiling.StepTrace(profiling.steps(keys.profile_steps),
                              run.workdir, accounts)
  previous = None
  accounts.switch("train")
  try:
    with preemption.StopRequest() as stop_requested:
      for step in range(start_step + 1, total + 1):
        trace.before(step)
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
          with report.counting("input"):
            batch = sharding.to_global(next(batches), program.batch_sharding)
          state, metrics = program.train_step(state, batch)
        trace.after(step, metrics)
        # Waiting for the previous step keeps at most one step queued behind
        # the running one: the CPU runtime deadlocks its collectives when
        # many are queued, and on TPU one queued step hides the dispatch.
        if previous is not None:
          ensure_finite(previous, step - 1, restored_at)
        previous = metrics
        stopping = stop_requested(step)
        log_now = stopping or reporting.due(step, keys.log_every, total)
        save_now = stopping or step == branch or reporting.due(
            step, keys.checkpoint_every, total)
        if log_now or save_now or evaluate.any_due(step):
          ensure_finite(metrics, step, restored_at)
        report.step(step, metrics, log_now)
        with report.paused("eval"):
          results = evaluate.run_due(step, polyak.eval_params(state))
        report.evaluated(step, results)
        if save_now:
          with report.paused("checkpoint"):
            checkpoints.save(manager, step, state, report.saved_progress())
        checkpoints.check_saves(manager)  # A failed save stops the run now.
        if stopping:
          report.last["stopped_at_step"] = step
          break
  finally:
    with report.counting("profile"):
      trace.close()
    # Even when a step fails, the save under way completes: the run
    # resumes from it rather than from an older step.
    with report.counting("checkpoint"):
      checkpoints.finish(manager)
    report.close()
  return report.last


def report_finished(run, program):
  """When the run's checkpoint of its last step is whole, the evaluators'
  results on it and the core-days the run cost, else None (train, and set
  a damaged one aside then). Reads the workdir and writes nothing."""
  newest = max(run.workdir.checkpoint_steps(), default=0)
  if newest < run.settings.total_steps:
    return None
  manager = run.workdir.checkpoint_reader()
  restored = checkpoints.restore_if_whole(manager, newest,
                                          program.state_shapes)
  if restored is None:
    return None
  state, saved = restored
  results = evaluators.Evaluators(run, program).run_all(
      polyak.eval_params(state))
  seconds = goodput.saved(saved)
  return {**results, "time": seconds,
          "core_days": timing.core_days(goodput.total(seconds))}


def resume_or_start(manager, program, keys, accounts, adapted=None):
  """(state, saved, whether it resumed): the latest checkpoint's state and
  what it carried (seconds, skipped examples, mesh), or a new run's (from
  `adapted`, its init_from's params, where read already)."""
  with accounts.counting("checkpoint"):
    restored = checkpoints.restore_newest_whole(manager, program.state_shapes)
  if restored:
    state, saved = restored
    return state, {"skipped_examples": 0, **saved}, True
  return (step_lib.initial_state(program, keys, adapted),
          {"seconds": goodput.zeros(), "skipped_examples": 0}, False)


def train_batches(run, start_step):
  """This process's share of each global batch, from `start_step` on; the
  log names the first broken images (broken_records.named). A packed run's
  (data/packing.py) reads from the step before, whose left-over images its
  first batch packs."""
  keys, packs = run.settings, run.packing
  process_shares = shares.process_shares(run.mesh, keys.input_shares)
  batch_size, first = keys.batch_size, start_step
  sequences = keys.batch_size // keys.input_shares  # A share's.
  if packs:
    batch_size = packs.images_per_share(sequences) * keys.input_shares
    first = max(start_step - 1, 0)
  batches = pipeline.train_dataset(
      run.source, keys.train_split, batch_size=batch_size,
      image_size=keys.image_size, augmentation=run.augmentation,
      seed=keys.seed, start_step=first, shares=process_shares,
      num_shares=keys.input_shares, naflex=run.naflex,
      packing=packs, tokenize=run.parts.objective.tokenize()
  ).as_numpy_iterator()
  batches = broken_records.named(batches, f"{keys.dataset} {keys.train_split}",
                                 keys.broken_images)
  if packs:
    batches = packing.packed(batches, len(process_shares), sequences,
                             packs, skip_first=start_step > 0)
  return batches


def ensure_finite(metrics, step, resumed_at=None):
  """Stops the run at a non-finite loss (divergence.Diverged), before
  anything of it is saved. `resumed_at`: the step this run resumed from,
  if it did."""
  loss = float(metrics["train_loss"])
  if not np.isfinite(loss):
    raise divergence.Diverged(step, loss, resumed_at)
