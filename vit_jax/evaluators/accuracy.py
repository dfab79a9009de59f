"""Top-1 accuracy over a split, every example counted once across hosts."""

from vit_jax import input_pipeline, sharding


def evaluate(program, params, config):
  """Top-1 accuracy on config.test_split, every example counted once."""
  shares, num_shares = sharding.process_shares(program.batch_sharding.mesh)
  dataset = input_pipeline.eval_dataset(
      config.dataset, config.test_split, batch_size=config.batch_size,
      image_size=config.image_size, shares=shares, num_shares=num_shares,
      data_dir=config.data_dir or None,
      eval_crop_fraction=config.eval_crop_fraction)
  correct = count = 0
  for batch in dataset.as_numpy_iterator():
    totals = program.eval_step(
        params, input_pipeline.to_global(batch, program.batch_sharding))
    correct += int(totals["correct"])
    count += int(totals["count"])
  return correct / count
