"""Runs that move between slices: the input shares that keep their batches,
and what a move changes.

A training split is read in `config.input_shares` shares (input_pipeline):
block s of every global batch comes from share s. Each data-parallel
device reads a consecutive group of input_shares / (data x fsdp) shares, so
the global batches are the same on any mesh whose data-parallel size
divides input_shares: a run stopped on 8 devices resumes on 4, or on 2 hosts
of 2, with the batches it would have had.

The count is chosen when a run starts and recorded in its config.json; a
resume reads it from there. Unset, it is the data-parallel size of the
start doubled while the result, up to MAX_SHARES, divides the batch and
leaves each share MIN_SHARE_EXAMPLES examples:
  - MAX_SHARES = 2048 is the core count of a v3-2048, the largest slice, so
    a run may move between any power-of-two v3 slices of pure data
    parallelism (v3-8 to v3-2048); a batch of 4096 has 2 examples per share.
  - Doubling, because slices and their meshes come in powers of two.
  - MIN_SHARE_EXAMPLES: each share is shuffled within itself, and one of a
    few examples would make the batches of one epoch nearly those of the
    next. Digits (1,437 training images, batch 128) gets 16 shares of about
    90 examples: it runs on 1 to 16 data-parallel devices.
"""

import math

from vit_jax import errors, input_pipeline, sharding
from vit_jax import workdir as workdir_lib

MAX_SHARES = 2048
MIN_SHARE_EXAMPLES = 64


def default(batch_size, num_examples, data_parallel):
  """The input_shares of a new run (see the module docstring)."""
  shares = data_parallel
  while (shares * 2 <= MAX_SHARES and batch_size % (shares * 2) == 0
         and num_examples // (shares * 2) >= MIN_SHARE_EXAMPLES):
    shares *= 2
  return shares


def with_input_shares(config, workdir, mesh):
  """`config` with input_shares set: as the run in `workdir` recorded it,
  else as the config sets it, else `default`; refused when the mesh's
  data-parallel devices cannot split it."""
  data_parallel = sharding.data_parallel_size(mesh)
  shares = config.get("input_shares")
  if shares is None and workdir_lib.has_run(workdir):
    # As recorded (a run recorded before there were input shares read one
    # per data-parallel device); a set value that differs is refused by
    # workdir.check.
    shares = workdir_lib.read_config(workdir).get("input_shares",
                                                  data_parallel)
  elif shares is None:
    examples = input_pipeline.num_examples(config.dataset, config.train_split,
                                           config.data_dir)
    shares = default(config.batch_size, examples, data_parallel)
  if shares % data_parallel or config.batch_size % shares:
    raise errors.ConfigError(
        f"config.input_shares={shares} cannot be read by {data_parallel} "
        f"data-parallel devices (mesh {sharding.describe_mesh(mesh.shape)}) "
        f"in blocks of config.batch_size={config.batch_size}: it must be a "
        f"multiple of data x fsdp and divide the batch. A resumed run keeps "
        f"the count it started with: resume it on a mesh whose data x fsdp "
        f"divides {shares}")
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.input_shares = shares
  return config


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


def moved(progress, mesh):
  """{"devices": (old, new)} when the checkpoint's `progress` was saved on
  another mesh than `mesh`, else {}: a change that the config does not show
  where a mesh size of -1 takes whatever devices there are."""
  saved = progress.get("mesh")
  now = dict(mesh.shape)
  if saved is None or saved == now:
    return {}
  return {"devices": (describe(saved), describe(now))}


def describe(shape):
  """{"data": 8, ...} -> "8 (data=8 x fsdp=1 x model=1)"."""
  return f"{math.prod(shape.values())} ({sharding.describe_mesh(shape)})"
