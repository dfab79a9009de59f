"""Every tool answers a user's mistake the same way (vit_jax/cli/): exit
status 2, `error: ...` naming what was wrong in at most 3 lines, no
traceback; a bug keeps its traceback and exits 1.

The tools run in the test's process (tests/util.py, call_tool), as the
wrapper's own cases do (call_main); a process of their own only where the
process is what is tested: its exit handlers, a signal."""

import asyncio
import atexit
import errno
import logging as std_logging
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorstore as ts
from absl import flags, logging
from ml_collections import config_flags
from PIL import Image

from tests.util import REPO, call_main, call_tool, from_a_shell
from vit_jax import cli, errors, models, runtime
from vit_jax.cli import logs, messages, signals
from vit_jax.weights import npz as npz_lib

DIGITS = ["vit_jax.main", "--config=configs/digits.py"]

# (tool and arguments, what the message must name); {tmp} is a scratch
# directory holding `text.txt`, `empty/`, `cut.npz` (a truncated .npz),
# `array.npy` and `small.npz` (a ViT narrower than the digits config's).
MISTAKES = {
    "mesh larger than the devices": (
        [*DIGITS, "--workdir={tmp}/w", "--config.mesh.data=3"],
        "config.mesh data=3"),
    "unknown decay": (
        [*DIGITS, "--workdir={tmp}/w", "--config.optimizer.decay=exp"],
        "config.optimizer.decay"),
    "missing config file": (
        ["vit_jax.main", "--config=configs/nothere.py", "--workdir={tmp}/w"],
        "configs/nothere.py"),
    "warm-up longer than the run": (
        [*DIGITS, "--workdir={tmp}/w", "--config.total_steps=50"],
        "warmup_steps"),
    "unknown config key": (
        [*DIGITS, "--workdir={tmp}/w", "--config.no_such_key=1"],
        "no_such_key"),
    "override of the wrong type": (
        [*DIGITS, "--workdir={tmp}/w", "--config.total_steps=many"],
        "config.total_steps"),
    "unknown dataset": (
        [*DIGITS, "--workdir={tmp}/w", "--config.dataset=no_such_data"],
        "no_such_data"),
    "init_from not an npz": (
        [*DIGITS, "--workdir={tmp}/w", "--config.init_from={tmp}/text.txt"],
        "text.txt"),
    "init_from that is not there": (
        [*DIGITS, "--workdir={tmp}/w", "--config.init_from={tmp}/nowhere"],
        "config.init_from='{tmp}/nowhere': {tmp}/nowhere does not exist"),
    "init_from a PyTorch pickle": (
        [*DIGITS, "--workdir={tmp}/w", "--config.init_from={tmp}/model.bin"],
        "model.bin is a PyTorch pickle"),
    "workdir not writable": (
        [*DIGITS, "--workdir={tmp}/text.txt/run"], "text.txt/run"),
    "bad config argument": (
        ["vit_jax.main", "--config=configs/table2/pretrain.py:X/9,jft",
         "--workdir={tmp}/w"], "X/9,jft"),
    "unknown plan topology": (
        ["vit_jax.plan", "--config=configs/digits.py", "--topology=v9-8"],
        "v9-8"),
    "export from a missing file": (
        ["vit_jax.export", "--from={tmp}/none.npz", "--out={tmp}/o.npz"],
        "none.npz"),
    "export from a text file": (
        ["vit_jax.export", "--from={tmp}/text.txt", "--out={tmp}/o.npz"],
        "text.txt"),
    "export from a truncated npz": (
        ["vit_jax.export", "--from={tmp}/cut.npz", "--out={tmp}/o.npz"],
        "cut.npz"),
    "export from a single array": (
        ["vit_jax.export", "--from={tmp}/array.npy", "--out={tmp}/o.npz"],
        "array.npy"),
    "export of an empty workdir": (
        ["vit_jax.export", "--workdir={tmp}/empty", "--out={tmp}/o.npz"],
        "empty"),
    "export to HF over a file": (
        ["vit_jax.export", "--from={tmp}/small.npz", "--format=hf",
         "--out={tmp}/text.txt"],
        "--out={tmp}/text.txt is an existing file, and --format=hf writes a "
        "directory"),
    "export with no source": (
        ["vit_jax.export", "--out={tmp}/o.npz"], "--workdir"),
    "predict from no run": (
        ["vit_jax.predict", "--workdir={tmp}/empty", "{tmp}/text.txt"],
        "holds no run"),
    "predict without images": (
        ["vit_jax.predict", "--workdir={tmp}/empty"], "no images"),
    "figures of a missing workdir": (
        ["vit_jax.figures", "--workdir={tmp}/nowhere"], "nowhere"),
    "figures of an npz without --out": (
        ["vit_jax.figures", "--from={tmp}/cut.npz"], "--out"),
    "unknown VTAB task": (
        ["vit_jax.vtab", "--config=configs/vtab.py:L/16", "--workdir={tmp}/v",
         "--tasks=natural,imagenet"], "imagenet"),
    "vtab without workdir": (
        ["vit_jax.vtab", "--config=configs/vtab.py:L/16"], "--workdir"),
    "checkpoint that does not fit": (
        [*DIGITS, "--workdir={tmp}/w", "--config.init_from={tmp}/small.npz"],
        "the model wants"),
    "dataset not prepared": (
        [*DIGITS, "--workdir={tmp}/w", "--config.dataset=cifar10",
         "--config.data_dir={tmp}/empty"], "not prepared"),
    "predict a missing image": (
        ["vit_jax.predict", "--from={tmp}/small.npz", "{tmp}/none.png"],
        "none.png"),
    "predict with an input mean but no std": (
        ["vit_jax.predict", "--from={tmp}/small.npz", "--input_mean=0,0,0",
         "{tmp}/text.txt"], "--input_std"),
    "predict a file that is no image": (
        ["vit_jax.predict", "--from={tmp}/small.npz", "{tmp}/text.txt"],
        "text.txt"),
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("mistakes")
  (tmp / "text.txt").write_text("not a checkpoint\n")
  (tmp / "empty").mkdir()
  np.savez(tmp / "whole.npz", a=np.zeros(1000))
  (tmp / "cut.npz").write_bytes((tmp / "whole.npz").read_bytes()[:300])
  np.save(tmp / "array.npy", np.zeros(3))
  model = models.create("Ti/2", 10, hidden_size=16, num_layers=1, mlp_dim=32,
                        num_heads=2)
  params = model.init(jax.random.key(0), np.zeros((1, 8, 8, 3), np.float32),
                      train=False)["params"]
  npz_lib.save_npz(params, str(tmp / "small.npz"))
  return str(tmp)


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_gets_a_short_message_and_exit_status_2(scratch, name):
  (tool, *args), named = MISTAKES[name]
  status, stdout, stderr = call_tool(
      tool.removeprefix("vit_jax."), *[arg.format(tmp=scratch)
                                       for arg in args])
  assert status == cli.EXIT_USER_ERROR, stderr[-3000:]
  assert "Traceback" not in stderr + stdout
  lines = stderr.strip().splitlines()
  assert 1 <= len(lines) <= messages.MAX_ERROR_LINES, stderr
  assert lines[0].startswith("error: ")
  assert named.format(tmp=scratch) in stderr


@pytest.mark.parametrize("source", ["small.npz", "none.npz", "nowhere"])
def test_a_refused_init_from_leaves_no_trace_in_a_new_workdir(
    scratch, tmp_path, source):
  """A source that cannot fit the model (small.npz), or is not there, is
  refused before anything is written: no workdir, no lock, no empty
  checkpoints/ folder."""
  workdir = tmp_path / "new"
  status, _, stderr = call_tool(
      "main", *DIGITS[1:], f"--workdir={workdir}",
      f"--config.init_from={scratch}/{source}")
  assert status == cli.EXIT_USER_ERROR, stderr[-3000:]
  assert f"config.init_from='{scratch}/{source}'" in stderr
  assert not workdir.exists(), sorted(workdir.rglob("*"))


@pytest.mark.parametrize("given,key,suggested", [
    ("--config.total_step=5", "total_step", "total_steps"),
    ("--config.model.hiden_size=5", "hiden_size", "hidden_size")])
def test_a_misspelled_key_gets_its_suggestion_in_one_clean_line(
    scratch, given, key, suggested):
  """ml_collections puts its suggestion in the KeyError's quoted key (it
  showed as a literal \\' and \\n, and twice)."""
  status, stdout, stderr = call_tool(
      "main", "--config=configs/digits.py", f"--workdir={scratch}/w", given)
  assert (status, stdout) == (2, "")
  assert stderr.splitlines() == [
      f"error: {given}: the config has no key {key!r}; did you mean "
      f"{suggested!r}? (its keys: vit_jax/runs/settings.py)",
      "(--helpfull lists every flag)"]


# (tool and arguments, the start of the one line that refuses them); {out}
# is where the tool would write, which must not come to exist, {png} an
# image. A flag's bounds are absl's (lower_bound, validators), checked as
# the command line is parsed; a config's, as resolve checks its values.
BAD_VALUES = {
    "predict, no images a pass": (
        ["predict", "--from={tmp}/small.npz", "--batch_size=0", "{png}"],
        "flag --batch_size=0: 0 is not a positive integer"),
    "predict, a negative batch": (
        ["predict", "--from={tmp}/small.npz", "--batch_size=-2", "{png}"],
        "flag --batch_size=-2: -2 is not a positive integer"),
    "figures, no rollout images": (
        ["figures", "--from={tmp}/small.npz", "--out={out}", "{png}",
         "--rollout_images=0"],
        "flag --rollout_images=0: 0 is not a positive integer"),
    "figures, no images for the distances": (
        ["figures", "--from={tmp}/small.npz", "--out={out}", "{png}",
         "--num_images=0"],
        "flag --num_images=0: 0 is not a positive integer"),
    "export, no heads": (
        ["export", "--from={tmp}/small.npz", "--out={out}", "--num_heads=0"],
        "flag --num_heads=0: 0 is not a positive integer"),
    "export, a negative step": (
        ["export", "--workdir={tmp}", "--step=-1", "--out={out}"],
        "flag --step=-1: -1 is not a non-negative integer"),
    "main, no processes": (
        [*DIGITS, "--workdir={out}", "--num_processes=0"],
        "flag --num_processes=0: 0 is not a positive integer"),
    # And a config's keys that only mean something together.
    "main, RoPE's shift without RoPE": (
        [*DIGITS, "--workdir={out}", "--config.model.rope_shift=0.1"],
        "config.model.rope_shift=0.1 applies to rotary position embeddings"),
    "main, fewer slots than images read a sequence": (
        [*DIGITS, "--workdir={out}", "--config.naflex.max_num_patches=16",
         "--config.naflex.packing=True",
         "--config.naflex.images_per_sequence=2.5",
         "--config.naflex.max_images_per_sequence=1"],
        "config.naflex.max_images_per_sequence=1 is below "
        "config.naflex.images_per_sequence=2.5"),
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_value_is_one_line_and_nothing_is_written(scratch, tmp_path,
                                                        name):
  """A value out of a flag's bounds is refused before any model is read,
  compiled or written: `figures --rollout_images=0` wrote 3 of its 5 PNGs
  before a traceback, `predict --batch_size=0` ended in one."""
  png = tmp_path / "image.png"
  Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(png)
  out = tmp_path / "out"
  (tool, *args), says = BAD_VALUES[name]
  status, stdout, stderr = call_tool(
      tool.removeprefix("vit_jax."),
      *[arg.format(tmp=scratch, out=out, png=png) for arg in args])
  assert (status, stdout) == (cli.EXIT_USER_ERROR, ""), stderr[-3000:]
  assert stderr.startswith(f"error: {says}") and stderr.count("\n") == 1, (
      stderr)
  assert not out.exists(), sorted(out.rglob("*"))


def tool(argv):
  """A tool's main that raises what its one argument says."""
  if argv[1] == "logs, then user":
    # A library's error (this file is not vit_jax's).
    logging.error("a library's error")
    argv[1] = "user"
  if argv[1] == "user":
    raise errors.ConfigError("config.batch_size=3 is bad\nline 2\nline 3"
                             "\nline 4")
  if argv[1] == "disk":
    raise OSError(28, "No space left on device", "/data/run")
  raise RuntimeError("a bug")


@pytest.mark.parametrize("kind,code,traceback,message", [
    ("user", 2, False, "error: config.batch_size=3 is bad\nline 2\n"
     "line 3; line 4"),
    ("disk", 2, False, "error: /data/run: No space left on device"),
    ("bug", 1, True, "RuntimeError: a bug"),
])
def test_the_wrapper_tells_mistakes_from_bugs(kind, code, traceback, message):
  status, _, stderr = call_main(tool, "tool", kind, positional=True)
  assert status == code
  assert ("Traceback" in stderr) == traceback
  assert message in stderr


def test_a_user_mistake_is_all_that_is_shown():
  # Not a library's error logged before it.
  status, _, stderr = call_main(tool, "tool", "logs, then user",
                                positional=True)
  assert status == 2
  assert stderr.startswith("error: config.batch_size=3 is bad")
  assert "a library's error" not in stderr


# A tool whose main registers an exit handler and logs (this file is not
# vit_jax's): in a process of its own, whose end is what is tested.
ENDING_TOOL = """
from vit_jax import cli
cli.prepare()
import atexit
from absl import logging
def main(argv):
  atexit.register(print, "an exit handler ran", flush=True)
  logging.warning("a library's note")
  logging.error("a library's error")
  return 3
cli.run(main)
"""


def test_a_tool_ends_with_mains_status_after_the_exit_handlers():
  done = subprocess.run([sys.executable, "-c", ENDING_TOOL], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 3
  assert done.stdout == "an exit handler ran\n"
  # A library's errors are shown as the tool ends, its warnings are not.
  assert "a library's error" in done.stderr
  assert "a library's note" not in done.stderr


def test_verbose_shows_a_mistakes_traceback_too():
  status, _, stderr = call_main(tool, "tool", "user", "--verbose",
                                positional=True)
  assert status == 2
  assert "Traceback" in stderr and "error: config.batch_size" in stderr


@pytest.fixture
def config_flag():
  """--config, an ml_collections config file, for the test; a tool of it
  alone checks what the wrapper says of a file that does not load apart
  from training."""
  config_flags.DEFINE_config_file("config", None, "A config file.")
  yield
  delattr(flags.FLAGS, "config")


def config_tool(argv):
  del argv
  print(flags.FLAGS.config.total_steps)


@pytest.mark.parametrize("args,message", [
    (["--config=configs/nothere.py"], "--config=configs/nothere.py: no such "
     "file"),
    # The override fails first, on the config that did not load.
    (["--config", "configs/nothere.py", "--config.total_steps=3"],
     "--config=configs/nothere.py: no such file"),
    (["--config=configs"], "--config=configs: Is a directory"),
    (["--config=configs/digits.py:x"], "--config=configs/digits.py:x: "
     "get_config() takes 0 positional arguments"),
])
def test_a_config_file_that_does_not_load_is_named(config_flag, args,
                                                     message):
  status, _, stderr = call_main(config_tool, "tool", *args)
  assert status == cli.EXIT_USER_ERROR, stderr
  assert stderr.startswith(f"error: {message}"), stderr


def test_configs_load_from_any_folder(config_flag, tmp_path, monkeypatch):
  # As a tool started outside the checkout: the checkout not on the path,
  # and `configs` not imported yet.
  monkeypatch.setattr(sys, "path", [
      entry for entry in sys.path if os.path.abspath(entry) != REPO])
  for name in [name for name in sys.modules
               if name.partition(".")[0] == "configs"]:
    monkeypatch.delitem(sys.modules, name)
  # A shipped config by its absolute path, and a user's own beside them
  # that builds on the shipped base.
  (tmp_path / "mine.py").write_text(
      "from configs import base\n"
      "def get_config():\n"
      "  config = base.get_config()\n"
      "  config.total_steps = 7\n"
      "  return config\n")
  for config, total_steps in ((os.path.join(REPO, "configs", "digits.py"),
                               "1000"), ("mine.py", "7")):
    status, stdout, stderr = call_main(config_tool, "tool",
                                       f"--config={config}", cwd=tmp_path)
    assert status == 0, stderr
    assert stdout.split() == [total_steps]


class Doomed:

  def __del__(self):
    raise KeyError("another unraisable error")


def closed_loop_tool(argv):
  """Leaves a tensorstore future's callback to an event loop that is
  closed, as a failed checkpoint write leaves orbax's, then raises another
  error where nothing can catch it."""
  del argv
  promise, future = ts.Promise.new()

  async def wait():
    await future
  loop = asyncio.new_event_loop()
  task = loop.create_task(wait())
  loop.run_until_complete(asyncio.sleep(0.01))
  loop.close()
  promise.set_result(None)
  # Pending for ever: asyncio would say so as pytest's process ends, which
  # a tool's process, ended by the wrapper, does not live to see.
  task._log_destroy_pending = False  # pylint: disable=protected-access
  Doomed()


@pytest.mark.parametrize("verbose", [False, True])
def test_callbacks_to_a_closed_event_loop_are_quiet(verbose):
  status, _, stderr = call_main(closed_loop_tool, "tool",
                                *["--verbose"] * verbose)
  assert status == 0, stderr
  assert ("Event loop is closed" in stderr) == verbose
  assert "KeyError: 'another unraisable error'" in stderr


# A tool whose signal arrives while a garbage collector's callback runs (JAX
# registers one), where Python prints the handler's exception and drops it:
# the signal handlers are the process's.
SIGNAL_IN_A_GC_CALLBACK_TOOL = """
from vit_jax import cli
cli.prepare()
import gc, os, signal, time
def in_collection(phase, info):
  if phase == "start":
    os.kill(os.getpid(), signal.SIGINT)  # Its handler runs here.
def main(argv):
  gc.callbacks.append(in_collection)
  gc.collect()
  gc.callbacks.remove(in_collection)
  time.sleep(5)
  print("went on")
cli.run(main)
"""


def test_a_signal_inside_a_gc_callback_still_stops_the_tool():
  done = subprocess.run(from_a_shell(["-c", SIGNAL_IN_A_GC_CALLBACK_TOOL]),
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 128 + 2, done.stdout + done.stderr
  assert "went on" not in done.stdout
  assert done.stderr.splitlines()[-1] == (
      "error: stopped by SIGINT; files written so far are whole: run the "
      "same command again"), done.stderr


def process_state():
  """What a tool run in the test's process could leave changed."""
  handler = logging.get_absl_handler()
  return {
      "flags": {name: (flags.FLAGS[name].value, flags.FLAGS[name].present)
                for name in flags.FLAGS},
      "parsed": flags.FLAGS.is_parsed(),
      "root handlers": list(std_logging.root.handlers),
      "levels": [std_logging.getLogger(name).level
                 for name in ("", "absl", "tensorflow")],
      "absl handler": (list(handler.filters), handler.python_handler.stream),
      "hooks": (sys.unraisablehook, sys.excepthook),
      "signals": [signal.getsignal(s) for s in (signal.SIGINT,
                                                 signal.SIGTERM)],
      "path": list(sys.path), "argv": list(sys.argv), "cwd": os.getcwd(),
      "exit status": cli._exit_status,  # pylint: disable=protected-access
      "held errors": list(logs._held_errors),  # pylint: disable=protected-access
      "compilation cache": (jax.config.jax_enable_compilation_cache,
                            jax.config.jax_compilation_cache_dir),
  }


def test_a_tool_run_in_the_tests_process_leaves_it_as_found(scratch):
  before = process_state()
  for command, args in (
      ("main", MISTAKES["warm-up longer than the run"][0][1:]),
      ("export", MISTAKES["export with no source"][0][1:]),
      ("predict", ["--from={tmp}/small.npz", "--verbose", "{tmp}/text.txt"])):
    status, _, _ = call_tool(command, *[arg.format(tmp=scratch)
                                        for arg in args])
    assert status == cli.EXIT_USER_ERROR
    assert process_state() == before
  assert call_main(tool, "tool", "logs, then user", positional=True)[0] == 2
  assert process_state() == before


def test_user_errors_are_told_by_kind():
  assert messages.is_user_error(errors.InputError("x"))
  assert messages.is_user_error(FileNotFoundError(errno.ENOENT, "gone", "/a"))
  assert messages.is_user_error(OSError(errno.ENOSPC, "full"))
  assert not messages.is_user_error(ValueError("a bug's ValueError"))
  assert not messages.is_user_error(KeyError("k"))
  assert not messages.is_user_error(OSError(errno.EIO, "I/O error"))


def test_prepare_quietens_the_libraries_but_keeps_the_users_settings(
    monkeypatch):
  # The environment alone: the signal and exit handlers stay pytest's.
  monkeypatch.setattr(signals, "stop_quietly", lambda: None)
  monkeypatch.setattr(atexit, "register", lambda function: function)
  environ = {"VIT_JAX_CPU_DEFAULTS": "0",  # No re-execution here.
             "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "1"}
  monkeypatch.setattr(os, "environ", dict(environ))
  monkeypatch.setattr(sys, "argv", ["tool"])
  cli.prepare()
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"
  assert os.environ["GRPC_VERBOSITY"] == "ERROR"

  monkeypatch.setattr(os, "environ", dict(environ))
  monkeypatch.setattr(sys, "argv", ["tool", "--verbose"])
  cli.prepare()
  # Keras is kept out either way.
  assert os.environ == {**environ, **runtime.LEAN_TENSORFLOW}
