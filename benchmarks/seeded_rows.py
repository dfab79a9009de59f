"""What benchmarks/regularisation.py and optimizers.py share: a digits run
scored by its test accuracy, and each row's runs over seeds printed as one
line: the median test accuracy, each seed's, and each seed's last train
loss."""

import statistics
import tempfile


def digits_score(overrides, steps):
  """(test accuracy, last train loss) of configs/digits.py run `steps`
  steps with `overrides` (dotted keys), evaluated at its end only."""
  from configs import digits  # pylint: disable=g-import-not-at-top
  from vit_jax.training import loop, resolve  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  config.update_from_flattened_dict({
      "total_steps": steps, "evaluators.test.every": steps,
      "checkpoint_every": steps, "log_every": steps, **overrides})
  with tempfile.TemporaryDirectory() as workdir:
    results = loop.train_and_evaluate(resolve.run(config, workdir))
  return float(results["test_accuracy"]), float(results["train_loss"])


def report(rows, score, seeds):
  """Runs `score(row, seed)` -> (test accuracy, last train loss) for each
  of `rows` (names) and seeds 0..seeds-1, printing a line per row."""
  for row in rows:
    scores = [score(row, seed) for seed in range(seeds)]
    accuracies = [a for a, _ in scores]
    print(f"{row:13s} median {statistics.median(accuracies):.4f} | seeds "
          f"{' '.join(f'{a:.4f}' for a in accuracies)} | train loss "
          f"{' '.join(f'{loss:.3f}' for _, loss in scores)}", flush=True)
