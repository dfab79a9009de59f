"""Small helpers shared by tests: random weights, small digits runs, the
tools run in the test's own process, and `vit_jax.main` in processes of
its own where the process is what is tested."""

import contextlib
import fcntl
import io
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import time
import unittest.mock
import warnings

import jax
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def made_once(tmp_path_factory, name, make):
  """The directory `name`, filled by `make(path)` once for all the pytest
  workers of the session: the first to get here makes it while the others
  wait, then all read it."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # The session's directory, above each worker's own.
  path = root / name
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (path / ".made").exists():
      shutil.rmtree(path, ignore_errors=True)
      path.mkdir()
      make(str(path))
      (path / ".made").touch()
  return str(path)


def randomize(tree, seed=0, scale=0.2):
  """Adds Gaussian noise to every leaf: fresh inits have zero heads and unit
  LayerNorm scales, which would hide mistakes that random weights expose."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda x: (np.asarray(x) + scale * rng.standard_normal(x.shape)).astype(
          np.asarray(x).dtype), tree)


# On the mesh that the tests' 8 devices allow for data and tensor
# parallelism together: data 4 x model 2. With light regularisation: the
# digits recipe's (dropout 0.2, weight decay 0.05) is for its 1000 steps, and
# slows the first few dozen steps that these runs take.
SMALL = {
    "mesh.data": 4,
    "mesh.model": 2,
    "model.dropout_rate": 0.1,
    "optimizer.weight_decay": 1e-4,
    "model.hidden_size": 32,
    "model.num_layers": 2,
    "model.mlp_dim": 64,
    "model.num_heads": 4,
    "batch_size": 32,
    "total_steps": 6,
    "optimizer.warmup_steps": 2,
    "log_every": 3,
    "evaluators.test.every": 3,
    "checkpoint_every": 3,
}


def small_config(data_dir, **overrides):
  """The digits config shrunk to a run of a few seconds, with `overrides`
  given as dotted keys."""
  from configs import digits  # pylint: disable=g-import-not-at-top
  config = digits.get_config()
  config.update_from_flattened_dict({**SMALL, "data_dir": data_dir,
                                     **overrides})
  return config


def run_training(config, workdir):
  """What `vit_jax.main` does, in this process: resolve the run, train it."""
  from vit_jax.training import loop, resolve  # pylint: disable=g-import-not-at-top
  return loop.train_and_evaluate(resolve.run(config, workdir))


def check_config(config):
  """Every check of vit_jax.training.resolve's that reads neither a
  checkpoint nor a workdir (the config's values, mesh, model and data);
  returns the mesh."""
  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top
  from vit_jax.training import resolve  # pylint: disable=g-import-not-at-top
  keys = typed(config)
  mesh = resolve.program(keys).mesh
  resolve.check_data(resolve.check_values(keys),
                     sources.Sources(keys.dataset, keys.data_dir))
  return mesh


def poison_step(monkeypatch, at_step):
  """Makes the train step of the runs built from now on turn their params
  and loss into NaN at step `at_step`."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from vit_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top
  real_make_train_step = step_lib.make_train_step

  def poisoned(*args, **kwargs):
    train_step = real_make_train_step(*args, **kwargs)

    def step(state, batch, *bound):
      state, metrics = train_step(state, batch, *bound)
      poison = jnp.where(state.step == at_step, jnp.nan, 1.0)
      state = state.replace(
          params=jax.tree.map(lambda p: p * poison, state.params))
      return state, {**metrics, "train_loss": metrics["train_loss"] * poison}
    return step

  monkeypatch.setattr(step_lib, "make_train_step", poisoned)


def sigterm_at_step(patch, at):
  """Has the programs built from now on (while `patch`, a monkeypatch,
  holds) send this process SIGTERM as the `at`-th train step they run
  starts."""
  from vit_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top
  real_build, steps = step_lib.build, []

  def build(*args, **kwargs):
    program = real_build(*args, **kwargs)

    def step(state, batch):
      steps.append(step)
      if len(steps) == at:
        os.kill(os.getpid(), signal.SIGTERM)
      return program.train_step(state, batch)
    return program._replace(train_step=step)

  patch.setattr(step_lib, "build", build)


def run_stopped_and_resumed(config, workdir, monkeypatch, at):
  """Runs `config` in `workdir`, stopped by SIGTERM as its `at`-th train
  step starts, then resumed to its end (what a preempted run does)."""
  with monkeypatch.context() as patch:
    sigterm_at_step(patch, at)
    assert run_training(config, workdir)["stopped_at_step"] == at
  run_training(config, workdir)


def train_steps(program, state, config, num_steps, augment=()):
  """(the losses, the state) after `num_steps` steps of `program` on digits
  batches of `config`'s size."""
  from vit_jax import sharding
  from vit_jax.data import pipeline as pipeline_lib, preprocess, sources
  batches = pipeline_lib.train_dataset(sources.lookup("digits",
                                                      config.data_dir),
                                       "train",
                                       batch_size=config.batch_size,
                                       image_size=config.image_size,
                                       augmentation=preprocess.augmentation(
                                           augment)).as_numpy_iterator()
  losses = []
  for _ in range(num_steps):
    batch = sharding.to_global(next(batches), program.batch_sharding)
    state, metrics = program.train_step(state, batch)
    losses.append(float(metrics["train_loss"]))
  return losses, state


def main_flags(workdir, data_dir, **overrides):
  """`vit_jax.main` arguments for small_config(data_dir, **overrides)."""
  values = {**SMALL, "data_dir": data_dir, **overrides}
  return (["--config=configs/digits.py", f"--workdir={workdir}"]
          + [f"--config.{key}={value}" for key, value in values.items()])


# A child inherits ignored and blocked signals, and something in a pytest
# worker leaves SIGINT ignored for a while (tests/conftest.py names the test
# it ends under): a tool the signal tests stop starts as from a shell, with
# SIGINT and SIGTERM at their defaults, then runs its command in place.
FROM_A_SHELL = (
    "import os, signal, sys\n"
    "for number in (signal.SIGINT, signal.SIGTERM):\n"
    "  signal.signal(number, signal.SIG_DFL)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, "
    "(signal.SIGINT, signal.SIGTERM))\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")


def run_tool(tool, *args, cwd=REPO):
  """The stdout of `python -m vit_jax.<tool> ARGS` run in `cwd`
  (call_tool's, in this process), which must succeed."""
  status, stdout, stderr = call_tool(tool, *args, cwd=cwd)
  assert status == 0, stderr[-3000:]
  return stdout


def call_tool(tool, *args, cwd=REPO):
  """(exit status, stdout, stderr) of `python -m vit_jax.<tool> ARGS` run
  in `cwd`, in this process: the module run as __main__, as `python -m`
  runs it, but for cli.prepare, whose settings are the process's
  (tests/conftest.py makes this one's), then its main by call_main. The
  flags that vit_jax defines for it are taken away after, for the next
  call to define its own (tools share names such as --workdir); those of
  the libraries it imports stay, as their modules do."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  from vit_jax import cli  # pylint: disable=g-import-not-at-top
  given = {}

  def run(main, positional=False):
    given.update(main=main, positional=positional)

  defined = set(flags.FLAGS)
  try:
    with unittest.mock.patch.object(cli, "prepare"), \
        unittest.mock.patch.object(cli, "run", run):
      runpy.run_module(f"vit_jax.{tool}", run_name="__main__")
    return call_main(given["main"], f"vit_jax.{tool}", *args,
                     positional=given["positional"], cwd=cwd)
  finally:
    for name in set(flags.FLAGS) - defined:
      module = flags.FLAGS.find_module_defining_flag(name) or ""
      if module.startswith("vit_jax") or module not in sys.modules:
        delattr(flags.FLAGS, name)


def call_main(main, *argv, positional=False, cwd=REPO):
  """(exit status, stdout, stderr) of `cli.run(main, positional)` given the
  command line ARGV (the tool's name first), in this process
  (tests/in_process.py), run in `cwd`, with Python's own warning filters
  and unraisable hook (pytest's keep what a process would print). JAX's
  compilation cache settings, which a tool that trains sets, are put back
  after; glibc's malloc thresholds that it sets stay (runtime's
  keep_freed_memory: how freed memory is kept, not what is computed; under
  `make test`, whose GLIBC_TUNABLES keeps the whole heap, it sets none)."""
  from tests import in_process  # pylint: disable=g-import-not-at-top
  cache = {name: getattr(jax.config, name) for name in (
      "jax_enable_compilation_cache", "jax_compilation_cache_dir")}
  stdout, stderr = io.StringIO(), io.StringIO()
  try:
    with contextlib.chdir(cwd), contextlib.redirect_stdout(stdout), \
        contextlib.redirect_stderr(stderr), unittest.mock.patch.object(
            sys, "unraisablehook", sys.__unraisablehook__), \
        warnings.catch_warnings():
      # Python's warnings filtered and shown as in a process of the tool's.
      warnings.resetwarnings()
      for action, category, module in PYTHONS_WARNING_FILTERS:
        warnings.filterwarnings(action, category=category, module=module,
                                append=True)
      warnings.showwarning = _show_warning
      status = in_process.run_here(main, list(argv), positional)
  finally:
    for name, value in cache.items():
      jax.config.update(name, value)
  if status == 128 + signal.SIGINT:
    # ^C stopped the tool, which no test sends to its own process: it was
    # meant for pytest.
    raise KeyboardInterrupt(stderr.getvalue())
  return status, stdout.getvalue(), stderr.getvalue()


# The warning filters Python starts with (its documentation, "Default
# Warning Filter"), in their order, for a tool run in this process.
PYTHONS_WARNING_FILTERS = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""))


def _show_warning(message, category, filename, lineno, file=None, line=None):
  """Python's own warnings.showwarning: to sys.stderr as it is now."""
  del file
  sys.stderr.write(warnings.formatwarning(message, category, filename, lineno,
                                          line))


def python_path():
  """PYTHONPATH for a process started from the checkout: the checkout
  first, then the session's own (tests/conftest.py's process counter)."""
  return os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))


def from_a_shell(python_args):
  """The command `python PYTHON_ARGS`, started with SIGINT and SIGTERM at
  their defaults whatever this process has left them at."""
  return [sys.executable, "-c", FROM_A_SHELL, *python_args]


def start_main(args, devices=8, cwd=REPO):
  """`python -m vit_jax.main ARGS` in a process of its own, with `devices`
  emulated devices and the session's other XLA flags, run in `cwd`."""
  others = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                  os.environ.get("XLA_FLAGS", ""))
  env = dict(os.environ, XLA_FLAGS=f"{others} "
             f"--xla_force_host_platform_device_count={devices}".strip())
  return subprocess.Popen(from_a_shell(["-m", "vit_jax.main", *args]),
                          cwd=cwd, env=dict(env, PYTHONPATH=python_path()),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def start_pod(num_processes, devices, args, cwd=REPO):
  """launch/local_pod.sh with this interpreter, run in `cwd`."""
  env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=python_path())
  return subprocess.Popen(
      [os.path.join(REPO, "launch", "local_pod.sh"), str(num_processes),
       str(devices), "--", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True)


def pid_of_process(workdir, index):
  """The pid of process `index` of the pod training in `workdir`."""
  found = subprocess.run(
      ["pgrep", "-f", "--", f"--workdir={workdir} .*--process_id={index}$"],
      capture_output=True, text=True).stdout.split()
  assert len(found) == 1, found
  return int(found[0])


def finish(process, timeout=300):
  """(returncode, stdout, stderr), killing the process if it hangs."""
  try:
    stdout, stderr = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    stdout, stderr = process.communicate()
    raise AssertionError(f"timed out; stderr: {stderr[-3000:]}") from None
  return process.returncode, stdout, stderr


def metric_rows(workdir):
  """The rows of a run's metrics.jsonl, local or gs:// ([] before any)."""
  from vit_jax.runs import writers
  return writers.read_rows(workdir)


def logged(workdir, key="train_loss"):
  """{step: value} of the metric `key` in the run's metrics.jsonl."""
  return {r["step"]: r[key] for r in metric_rows(workdir) if key in r}


def wait_for_step(workdir, step, process, timeout=300):
  """Waits until the run in `workdir` has logged train_loss at `step`."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if any(r["step"] >= step and "train_loss" in r
           for r in metric_rows(workdir)):
      return
    if process.poll() is not None:
      raise AssertionError(f"the run ended before step {step}: "
                           f"{process.stderr.read()[-3000:]}")
    time.sleep(0.05)
  raise AssertionError(f"step {step} not reached in {timeout} s")


def typed(config):
  """The Settings of `config`: a ConfigDict's, or Settings as they are
  (what pretrained.with_source gives)."""
  from vit_jax.runs import settings
  return (config if isinstance(config, settings.Settings)
          else settings.of(config))


def program_of(config, num_classes=10, mesh=None):
  """The program (vit_jax.training.step's) that a run of `config` (a
  ConfigDict or Settings) builds, over `mesh` (default: config.mesh over
  every device)."""
  import dataclasses

  from vit_jax import sharding
  from vit_jax.training import step as step_lib
  keys = typed(config)
  if mesh is None:
    mesh = sharding.make_mesh(dataclasses.asdict(keys.mesh))
  return step_lib.build(keys, mesh, step_lib.parts(keys, num_classes))


def latest_checkpoint(workdir, config, num_classes=10):
  """(step, params, progress) of the newest checkpoint in `workdir`."""
  state, progress = latest_state(workdir, config, num_classes)
  return int(state.step), state.params, progress


def latest_state(workdir, config, num_classes=10):
  """(the whole train state on the host: step, params, optimizer state,
  ..., progress) of the newest checkpoint in `workdir`."""
  from vit_jax.runs import checkpoints as checkpoints_lib
  from vit_jax.runs.workdir import Workdir
  program = program_of(config, num_classes)
  manager = Workdir(workdir).checkpoint_manager(3)
  state, progress = checkpoints_lib.restore_newest_whole(manager,
                                                   program.state_shapes)
  return jax.device_get(state), progress


def assert_trees_equal(actual, expected):
  jax.tree.map(np.testing.assert_array_equal, actual, expected)


def logging_batches(path, train_batches):
  """`train_batches` (vit_jax.training.loop's) that also appends, for each
  batch, a JSON line {"step", "rows": a fingerprint of each row} to
  `path`.<process index>."""
  import hashlib  # pylint: disable=g-import-not-at-top

  def batches(run, start_step):
    with open(f"{path}.{jax.process_index()}", "a") as log:
      for step, batch in enumerate(train_batches(run, start_step),
                                   start=start_step + 1):
        rows = [hashlib.sha256(image.tobytes() + label.tobytes()).hexdigest()
                for image, label in zip(batch["image"], batch["label"])]
        log.write(json.dumps({"step": step, "rows": rows}) + "\n")
        log.flush()
        yield batch
  return batches


def as_siglip_tower(params):
  """Flat release-layout params renamed as a SigLIP two-tower .npz holds
  its image tower: under "params/img/", big_vision's per-type module
  numbers in the blocks, the position embedding at the top."""
  renamed = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
             "LayerNorm_2": "LayerNorm_1", "MlpBlock_3": "MlpBlock_0"}
  tower = {}
  for key, value in params.items():
    parts = key.split("/")
    if key.startswith("Transformer/encoderblock_"):
      parts[2] = renamed.get(parts[2], parts[2])
    elif key == "Transformer/posembed_input/pos_embedding":
      parts = ["pos_embedding"]
    tower["params/img/" + "/".join(parts)] = np.asarray(value)
  return tower


def stored_examples(builder, split):
  """A split's examples as numpy dicts in file order, images encoded, from
  TFRecord or ArrayRecord files (TFDS's as_dataset reads only the first)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  decoders = {"image": tfds.decode.SkipDecoding()}
  if builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD:
    return list(builder.as_data_source(split, decoders=decoders))
  return list(tfds.as_numpy(builder.as_dataset(
      split=split, shuffle_files=False, decoders=decoders)))


@contextlib.contextmanager
def small_disk(path, size):
  """A tmpfs of `size` ("800k") mounted at `path` (made) for the block: a
  disk that fills up for real. Skips the test where mounting needs the
  root this is not."""
  import pytest  # pylint: disable=g-import-not-at-top
  os.makedirs(path, exist_ok=True)
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}",
                            "tmpfs", str(path)], capture_output=True)
  if mounted.returncode:
    pytest.skip("mounting a small tmpfs needs root")
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", str(path)], check=False)


@contextlib.contextmanager
def mocked_tfds(data_dir, records):
  """tfds.testing.mock_data over the metadata in `data_dir`, with
  `records(builder, split)` serving the examples of a split: also to the
  input pipeline, which reads the record files of a share itself. Training
  asks for a share by a tensor: `split` is then None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  from vit_jax.data import pipeline as pipeline_lib

  def examples(table, share):
    split = table.splits[share] if isinstance(share, int) else None
    with tf.init_scope():  # `records` may compute its examples eagerly.
      return records(table.source.builder, split)

  with tfds.testing.mock_data(data_dir=data_dir, as_dataset_fn=records), \
      unittest.mock.patch.object(pipeline_lib._ShareTable, "examples",  # pylint: disable=protected-access
                                 examples):
    yield
