"""Which shares of the training split each device reads.

A TFRecord training split is streamed in `config.input_shares` shares
(pipeline.py); an ArrayRecord one is read at random, where the shares only
say which rows of a batch are a device's. The count also sets Mixup's
groups (training/targets.py). Streamed:
block s of every global batch comes from share s. Each data-parallel
device reads a consecutive group of input_shares / (data x fsdp) shares, so
the global batches are the same on any mesh whose data-parallel size
divides input_shares: a run stopped on 8 devices resumes on 4, or on 2 hosts
of 2, with the batches it would have had.

The count is chosen when a run starts and recorded in its config.json
(vit_jax/training/resolve.py); a resume keeps it. Unset, it is the
data-parallel size of the start doubled while the result, up to
MAX_SHARES, divides the batch and leaves each share MIN_SHARE_EXAMPLES
examples:
  - MAX_SHARES = 2048 is the core count of a v3-2048, the largest slice, so
    a run may move between any power-of-two v3 slices of pure data
    parallelism (v3-8 to v3-2048); a batch of 4096 has 2 examples per share.
  - Doubling, because slices and their meshes come in powers of two.
  - MIN_SHARE_EXAMPLES: each share is shuffled within itself, and one of a
    few examples would make the batches of one epoch nearly those of the
    next. Digits (1,437 training images, batch 128) gets 16 shares of about
    90 examples: it runs on 1 to 16 data-parallel devices.
"""


from vit_jax import sharding

MAX_SHARES = 2048


MIN_SHARE_EXAMPLES = 64


def default(batch_size, num_examples, data_parallel):
  """The input_shares of a new run (see the module docstring)."""
  shares = data_parallel
  while (shares * 2 <= MAX_SHARES and batch_size % (shares * 2) == 0
         and num_examples // (shares * 2) >= MIN_SHARE_EXAMPLES):
    shares *= 2
  return shares


def process_shares(mesh, num_shares):
  """The consecutive shares this process reads: those of the data-parallel
  devices it drives (sharding.process_blocks)."""
  return shares_of(*sharding.process_blocks(mesh), num_shares)


def shares_of(blocks, data_parallel, num_shares):
  """The shares of the batch blocks `blocks` (consecutive), when each of
  `data_parallel` devices holds one block of num_shares / data_parallel
  shares."""
  per_device = num_shares // data_parallel
  return tuple(range(blocks[0] * per_device, (blocks[-1] + 1) * per_device))
