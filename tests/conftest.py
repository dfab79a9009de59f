"""Shared test setup: 8 emulated CPU devices, quiet TensorFlow, data, a
local Cloud Storage."""

# First of all, while pytest's first process is still one thread: a mount
# namespace of the session's own where Cloud Storage's hosts are the local
# emulator's (tests/gcs.py, for the gcs_bucket fixture). Its workers and the
# processes tests start inherit it.
from tests import gcs

gcs.enter_namespace()
# TensorFlow's gs:// client keeps an object's size for 5 s, read from the
# environment once, before the gcs_bucket fixture sets the rest: a test that
# reads a file which the run it started has rewritten since would read the
# new file cut at the old size (rows lost at the end).
import os  # pylint: disable=g-import-not-at-top,wrong-import-position

os.environ.setdefault("GCS_STAT_CACHE_MAX_AGE", "0")

import atexit
import shutil
import tempfile

# Set before jax or tensorflow is imported: both read them once, at import.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# The tests compile hundreds of small programs and run each for a few steps:
# LLVM at -O0, and XLA:CPU's older elemental emitters in place of its fusion
# emitters, compile them much faster (docs/testing.md; docs/speed_on_cpu.md).
# Results move within float32 rounding (fewer fused multiply-adds); every
# comparison in the tests is between runs of these same settings. Runs
# outside the tests keep XLA's defaults.
for flag, value in (("--xla_backend_optimization_level", "0"),
                    ("--xla_cpu_use_fusion_emitters", "false")):
  if flag not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += f" {flag}={value}"
# The matmul and reduction kernels that `python -m vit_jax.main` picks on a
# CPU (vit_jax/runtime.py), here too: the tests compare their own runs
# with those of the processes they start.
from vit_jax import runtime

os.environ["XLA_FLAGS"] += " " + runtime.kernel_flags(
    os.environ["XLA_FLAGS"])
# test_plan.py compiles for TPU slices in the pytest processes.
runtime.compile_ahead_of_time()
# The libraries as quiet as the tools make them (some CPUs get a notice from
# TensorFlow's oneDNN at import otherwise), in the processes tests start too.
for name, value in {**runtime.QUIET_ENVIRONMENT,
                    **runtime.LEAN_TENSORFLOW}.items():
  os.environ.setdefault(name, value)
# One XLA compilation cache for the session, shared by the pytest workers and
# every process the tests start: many tests compile the same small programs,
# each in a fresh process (a fifth of some files' time).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(
      prefix="vit_jax_xla_cache_")
  # The process that made it (the one pytest that starts the workers) is
  # the last to exit.
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"],
                  ignore_errors=True)
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

# Each Python process that the session starts costs seconds of imports
# (TensorFlow, JAX): tests call a tool in their own process
# (tests/util.py, call_tool) unless the process is what is tested. Every
# Python process started under the session, children's children too
# (launch/local_pod.sh's) and pytest's xdist workers, records itself at its
# start in the directory PROCESSES names, through a sitecustomize put first
# on PYTHONPATH; the session's summary counts them. A process named by its
# pid and start time: a pid may be reused, and a process that re-executes
# itself (vit_jax/runtime.py) is one process. A fork that goes on in Python
# (os.fork, multiprocessing's fork) is a process too, recorded in the child
# by a hook of os.register_at_fork. A Python process that would not record
# itself (started without PROCESSES or this PYTHONPATH, or with -I, -E or
# -S) is refused as it starts (an audit hook), saying what to give it. Not
# seen: a Python started so by another program (a shell's `env -i python`).
#
# The session fails when it started more than PROCESS_BUDGET (its workers
# and the local Cloud Storage's included), and a test fails when it started
# more than TEST_PROCESS_BUDGET, unless it is marked with its own allowance,
# `@pytest.mark.processes(N)`.
PROCESSES = "VIT_JAX_TEST_PROCESSES"
# 44: the self-distillation pod (tests/test_dino.py) and the image-text
# pod (tests/test_image_text.py: the chunked loss's ring across two
# processes), which their issues' bars ask for, added two each to the
# suite's 39.
PROCESS_BUDGET = 44
TEST_PROCESS_BUDGET = 1
SITECUSTOMIZE = r'''"""Written by tests/conftest.py: a Python process started under the
tests records itself, and each fork of itself, in the folder that
VIT_JAX_TEST_PROCESSES names, and refuses to start a Python process that
would not."""
import os
import sys

_FOLDER = "VIT_JAX_TEST_PROCESSES"
_SITE = os.path.dirname(os.path.abspath(__file__))


def _record(how):
  """This process, named by its pid and start time, as started by the test
  that PYTEST_CURRENT_TEST names ("pytest": none, an xdist worker)."""
  folder = os.environ.get(_FOLDER)
  if not folder:
    return
  try:
    with open("/proc/self/stat") as stat:
      started = stat.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    started = ""
  try:
    with open(os.path.join(folder, f"{os.getpid()}-{started}"), "w") as f:
      f.write(os.environ.get("PYTEST_CURRENT_TEST", "pytest") + "\n" + how)
  except OSError:
    pass


def _forked():
  """In a fork's child: a process, unless subprocess forked it to run a
  program (its preexec_fn), which records itself if it is a Python."""
  frame = sys._getframe().f_back
  while frame is not None:
    if (frame.f_code.co_name == "_execute_child"
        and frame.f_code.co_filename.endswith("subprocess.py")):
      return
    frame = frame.f_back
  _record("forked")


def _is_python(program):
  name = os.path.basename(program)
  return ((name.startswith("python") and not name[6:].strip("0123456789."))
          or os.path.realpath(program) == os.path.realpath(sys.executable))


def _isolating(argv):
  """Whether an interpreter's options (argv after its name) leave out
  PYTHONPATH or site: -I, -E or -S."""
  value_follows = False
  for arg in argv[1:]:
    arg = os.fsdecode(arg)
    if value_follows:
      value_follows = False
    elif arg in ("-", "--") or not arg.startswith("-"):
      return False  # A script or stdin: the options have ended.
    elif arg.startswith("--"):
      value_follows = arg == "--check-hash-based-pycs"
    else:
      for i, letter in enumerate(arg[1:], 2):
        if letter in "IES":
          return True
        if letter in "cm":
          return False  # Its command or module: the options have ended.
        if letter in "XW":
          value_follows = i == len(arg)
          break
  return False


def _refuse_unrecorded(event, args):
  """An audit hook: a Python process started without what records it is
  refused (RuntimeError)."""
  if event == "subprocess.Popen":
    executable, argv, _, env = args
  elif event in ("os.exec", "os.posix_spawn"):
    executable, argv, env = None, args[1], args[2]
    argv = [args[0], *list(argv)[1:]]
  else:
    return
  argv = ([argv] if isinstance(argv, (str, bytes, os.PathLike))
          else list(argv))
  program = executable if executable is not None else (argv or [""])[0]
  if not _is_python(os.fsdecode(program)):
    return
  env = os.environ if env is None else env

  def get(name):
    value = env.get(name, env.get(name.encode(), b"") if isinstance(
        env, dict) else "")
    return os.fsdecode(value or "")
  if (get(_FOLDER) and _SITE in get("PYTHONPATH").split(os.pathsep)
      and not _isolating(argv)):
    return
  raise RuntimeError(
      f"{os.fsdecode(program)} would start without the tests' count of "
      f"Python processes: give it this environment's {_FOLDER} and "
      f"PYTHONPATH, and none of -I, -E, -S (tests/conftest.py)")


if os.environ.get(_FOLDER):
  if not globals().get("_HOOKS_ONLY"):
    _record("started")
  os.register_at_fork(after_in_child=_forked)
  sys.addaudithook(_refuse_unrecorded)
'''
# Set by the session's first process alone, which counts.
_processes_started = None
if PROCESSES not in os.environ:
  _counter = tempfile.mkdtemp(prefix="vit_jax_processes_")
  atexit.register(shutil.rmtree, _counter, ignore_errors=True)
  _processes_started = os.path.join(_counter, "started")
  os.mkdir(_processes_started)
  os.mkdir(os.path.join(_counter, "site"))
  _site = os.path.join(_counter, "site", "sitecustomize.py")
  with open(_site, "w") as f:
    f.write(SITECUSTOMIZE)
  os.environ[PROCESSES] = _processes_started
  os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [
      os.path.join(_counter, "site"), os.environ.get("PYTHONPATH")]))
  # This process (not counted: the session itself) forks and starts
  # processes as the others do.
  exec(compile(SITECUSTOMIZE, _site, "exec"),  # noqa: S102  # pylint: disable=exec-used
       {"__name__": "vit_jax_test_processes", "__file__": _site,
        "_HOOKS_ONLY": True})

import signal  # pylint: disable=g-import-not-at-top
import threading  # pylint: disable=g-import-not-at-top
import warnings  # pylint: disable=g-import-not-at-top

import pytest  # pylint: disable=g-import-not-at-top


def started_processes(folder=None):
  """The Python processes recorded in `folder` (default: this session's),
  as (the test that started them, "started" or "forked"), one per
  process."""
  folder = folder or os.environ[PROCESSES]
  found = []
  for name in sorted(os.listdir(folder)):
    try:
      with open(os.path.join(folder, name)) as record:
        text = record.read()
    except OSError:
      continue
    test, _, how = text.partition("\n")
    found.append((test.rsplit(" (", 1)[0] or "pytest", how or "started"))
  return found


def _counts_the_session(config):
  """Whether this is a session's own process (not an xdist worker's), where
  a count is kept."""
  return (not hasattr(config, "workerinput")
          and os.path.isdir(os.environ.get(PROCESSES, "")))


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "processes(count): the Python processes the test may "
      f"start (default {TEST_PROCESS_BUDGET}; tests/conftest.py)")


def pytest_sessionfinish(session):
  """More processes than PROCESS_BUDGET fail the session."""
  if (_counts_the_session(session.config)
      and len(started_processes()) > PROCESS_BUDGET
      and session.exitstatus in (pytest.ExitCode.OK,
                                 pytest.ExitCode.NO_TESTS_COLLECTED)):
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
  """The Python processes the session started, by the test that started
  them ("pytest": its own workers), then their count."""
  if not _counts_the_session(terminalreporter.config):
    return
  started = started_processes()
  by_test = {}
  for test, how in started:
    name = test if how == "started" else f"{test} ({how})"
    by_test[name] = by_test.get(name, 0) + 1
  for test, count in sorted(by_test.items()):
    terminalreporter.write_line(f"{count:3d} {test}")
  terminalreporter.write_line(f"{len(started)} Python processes started")
  if len(started) > PROCESS_BUDGET:
    terminalreporter.write_line(
        f"FAILED: more Python processes than the session's budget of "
        f"{PROCESS_BUDGET} (tests/conftest.py, PROCESS_BUDGET): start fewer "
        f"(tests/util.py, call_tool)", red=True)


@pytest.fixture(autouse=True)
def _processes_within_budget(request):
  """A test that started more Python processes than it may (forks
  included) fails."""
  yield
  if not os.path.isdir(os.environ.get(PROCESSES, "")):
    return
  marker = request.node.get_closest_marker("processes")
  allowed = marker.args[0] if marker else TEST_PROCESS_BUDGET
  mine = [how for test, how in started_processes()
          if test == request.node.nodeid]
  if len(mine) > allowed:
    pytest.fail(
        f"{len(mine)} Python processes started ({mine.count('forked')} of "
        f"them forks), more than the {allowed} this test may start: start "
        f"fewer (tests/util.py, call_tool), or mark it "
        f"@pytest.mark.processes({len(mine)}) saying why",
        pytrace=False)


def _failed_on_ci(report):
  """`report`, a failure if it is a skip and this is CI (CI=true), where
  every test must run: a test that skips there tests nothing."""
  if (os.environ.get("CI") == "true" and report.skipped
      and not hasattr(report, "wasxfail")):
    where = report.longrepr
    if isinstance(where, tuple):  # (path, line, "Skipped: reason")
      where = f"{where[0]}:{where[1]}: {where[2]}"
    report.outcome = "failed"
    report.longrepr = f"skipped, which CI (CI=true) does not allow: {where}"
  return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  del item, call
  return _failed_on_ci((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
  del collector
  return _failed_on_ci((yield))


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _stop_signals_left_as_found(request):
  """A child starts with its parent's ignored and blocked signals: a test, or
  a library it calls, that left SIGINT or SIGTERM so in a pytest worker made
  the signal tests of later tests there fail (the tool went on and exited
  0). Each is put back after every test, and the test named in a warning."""
  yield
  if threading.current_thread() is not threading.main_thread():
    return
  left = []
  for number in STOP_SIGNALS:
    if signal.getsignal(number) is signal.SIG_IGN:
      signal.signal(number, signal.default_int_handler
                    if number == signal.SIGINT else signal.SIG_DFL)
      left.append(f"{number.name} ignored")
  blocked = set(STOP_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])
  if blocked:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    left.append(f"{', '.join(sorted(s.name for s in blocked))} blocked")
  if left:
    warnings.warn(f"{request.node.nodeid} left {'; '.join(left)}")


@pytest.fixture(scope="session")
def digits_data_dir(tmp_path_factory):
  """A TFDS data_dir with `digits` prepared once for the whole session."""
  # Imported here so that runs needing no data don't load TensorFlow.
  from vit_jax.data import sources
  data_dir = str(tmp_path_factory.mktemp("tensorflow_datasets"))
  sources.get_builder("digits", data_dir)
  return data_dir


@pytest.fixture(scope="session")
def digits_tfrecord_data_dir(tmp_path_factory):
  """A data_dir with `digits` prepared as TFRecord, read by the streaming
  reader (digits_data_dir's is ArrayRecord, read at random)."""
  from vit_jax.data import sources
  data_dir = str(tmp_path_factory.mktemp("tensorflow_datasets_tfrecord"))
  sources.get_builder("digits", data_dir, file_format="tfrecord")
  return data_dir


DIGITS_RUN = {"total_steps": 100, "batch_size": 64, "log_every": 20,
              "checkpoint_every": 100, "evaluators.test.every": 50,
              "optimizer.warmup_steps": 10, "model.dropout_rate": 0.0,
              "model.scan_layers": True, "model.hidden_size": 64,
              "model.mlp_dim": 128}


@pytest.fixture(scope="session")
def digits_run(digits_data_dir, tmp_path_factory):
  """(workdir, test images as PNGs, the run's test accuracy, its config):
  a digits run trained well past chance, once for all pytest workers.

  Its layers are scanned, as the Table 2 configs' are: the tools read
  runs of either kind."""
  # Imported here so that runs needing no data don't load TensorFlow.
  from tests.util import made_once, run_training, small_config, stored_examples
  from vit_jax.data import sources
  from vit_jax.runs import writers
  config = small_config(digits_data_dir, **DIGITS_RUN)

  def make(workdir):
    run_training(config, workdir)
    pngs = os.path.join(workdir, "test_pngs")
    os.makedirs(pngs)
    builder = sources.get_builder("digits", digits_data_dir)
    for i, example in enumerate(stored_examples(builder, "test")):
      with open(os.path.join(pngs, f"{i:03d}_{example['label']}.png"),
                "wb") as f:
        f.write(example["image"])

  workdir = made_once(tmp_path_factory, "digits_run", make)
  accuracy = [row["test_accuracy"] for row in writers.read_rows(workdir)
              if "test_accuracy" in row][-1]
  return workdir, os.path.join(workdir, "test_pngs"), accuracy, config


@pytest.fixture(params=["array_record", "tfrecord"])
def digits_any_format(request):
  """digits prepared in each format the input pipeline reads."""
  return request.getfixturevalue({
      "array_record": "digits_data_dir",
      "tfrecord": "digits_tfrecord_data_dir"}[request.param])


@pytest.fixture
def gcs_bucket(monkeypatch):
  """A new empty bucket of the session's local Cloud Storage, as its URL
  `gs://NAME`; the test's os.environ points every client at it
  (tf.io.gfile and so TFDS, CLU and etils.epath; orbax's tensorstore;
  google-cloud-storage), for the processes the test starts too.
  `tests.gcs.list_objects(url)` lists what landed. Skipped where the
  emulator can't run (not root, no mount namespaces), failed then on CI."""
  try:
    environment = gcs.start()
  except gcs.Unavailable as e:
    if os.environ.get("CI") == "true":
      pytest.fail(f"CI runs the Cloud Storage tests: {e}")
    pytest.skip(str(e))
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  url = gcs.create_bucket()
  yield url
  gcs.delete_bucket(url)
