"""train_and_evaluate(run): the training loop, start to end.

An image goes: TFDS record -> data/pipeline.py (per-process batch) ->
`to_global` (one jax.Array over the mesh) -> step.py's `train_step` (jit
with explicit shardings, donated state) -> metrics.jsonl / TensorBoard
(reporting.py), with the state saved by orbax every `checkpoint_every`
steps (runs/checkpoints.py). The run comes resolved (vit_jax/run.py).
"""

import os

import jax
import numpy as np

from vit_jax import errors
from vit_jax.data import broken_records, pipeline, shares
from vit_jax.runs import checkpoints, store
from vit_jax.training import (evaluators, polyak, preemption, reporting,
                              step as step_lib)


def train_and_evaluate(run):
  """Trains the resolved `run`, resuming from its workdir's latest
  checkpoint. Returns the last metrics written (the evaluators' last
  results and `core_days` among them), and `stopped_at_step` when a signal
  stopped the run early."""
  config, total = run.config, run.config.total_steps
  program = step_lib.build(config, run.mesh, run.num_classes)
  manager = checkpoints.manager(os.path.join(run.workdir, checkpoints.SUBDIR),
                                config.keep_checkpoints)
  state, saved, resumed = resume_or_start(manager, program, config)
  store.record(config, run.workdir, {
      **run.changes, **store.devices_change(saved.get("mesh"), run.mesh)})
  evaluate = evaluators.Evaluators(run, program)
  start_step = int(state.step)
  report = reporting.Report(run, program, start_step, saved, resumed)
  batches = train_batches(run, start_step)
  previous = None
  try:
    with preemption.StopRequest() as stop_requested:
      for step in range(start_step + 1, total + 1):
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
          batch = pipeline.to_global(next(batches), program.batch_sharding)
          state, metrics = program.train_step(state, batch)
        # Waiting for the previous step keeps at most one step queued behind
        # the running one: the CPU runtime deadlocks its collectives when
        # many are queued, and on TPU one queued step hides the dispatch.
        if previous is not None:
          ensure_finite(previous, step - 1)
        previous = metrics
        stopping = stop_requested(step)
        log_now = stopping or reporting.due(step, config.log_every, total)
        save_now = stopping or reporting.due(step, config.checkpoint_every,
                                             total)
        if log_now or save_now or evaluate.any_due(step):
          ensure_finite(metrics, step)
        report.step(step, metrics, log_now)
        with report.paused():  # Evaluation and saving are not steps.
          report.evaluated(step, evaluate.run_due(
              step, polyak.eval_params(state)))
          if save_now:
            checkpoints.save(manager, step, state, report.saved_progress())
        checkpoints.check_saves(manager)  # A failed save stops the run now.
        if stopping:
          report.last["stopped_at_step"] = step
          break
  finally:
    # Even when a step fails, the save under way completes: the run
    # resumes from it rather than from an older step.
    checkpoints.finish(manager)
    report.close()
  if start_step >= total:  # Finished in an earlier run: report, not train.
    report.finished_earlier(evaluate.run_all(polyak.eval_params(state)))
  return report.last


def resume_or_start(manager, program, config):
  """(state, saved, whether it resumed): the latest checkpoint's state and
  what it carried (training seconds, skipped examples, mesh), or a new
  run's."""
  restored = checkpoints.restore_latest(manager, program.state_shapes)
  if restored:
    state, saved = restored
    return state, {"skipped_examples": 0, **saved}, True
  return (step_lib.initial_state(program, config),
          {"train_seconds": 0.0, "skipped_examples": 0}, False)


def train_batches(run, start_step):
  """This process's share of each global batch, from `start_step` on; the
  log names the first broken images (broken_records.named)."""
  config = run.config
  batches = pipeline.train_dataset(
      run.source, config.train_split, batch_size=config.batch_size,
      image_size=config.image_size, augment=config.augment, seed=config.seed,
      start_step=start_step,
      shares=shares.process_shares(run.mesh, config.input_shares),
      num_shares=config.input_shares).as_numpy_iterator()
  return broken_records.named(batches, f"{config.dataset} "
                              f"{config.train_split}", config.broken_images)


def ensure_finite(metrics, step):
  """Stops the run at a non-finite loss, before anything of it is saved."""
  loss = float(metrics["train_loss"])
  if not np.isfinite(loss):
    raise errors.RunError(
        f"train_loss is {loss} at step {step}: stopped before saving any "
        "state of that step, so the workdir keeps its last good checkpoint. "
        "A lower optimizer.learning_rate, a longer warm-up or "
        "optimizer.grad_clip_norm may help.")
