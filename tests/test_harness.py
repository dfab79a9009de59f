"""The suite's own rules (tests/conftest.py), each on a small session of
pytest run in this process (pytester): on CI a skip fails; the Python
processes a session and a test start are counted, forks included, and
held to their budgets; a Python started so that it would not be counted
is refused."""

import os

import pytest

pytest_plugins = ["pytester"]

CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "conftest.py")


@pytest.fixture
def conftest(pytestconfig):
  """tests/conftest.py, the module this session runs with."""
  (module,) = [plugin for plugin in pytestconfig.pluginmanager.get_plugins()
               if getattr(plugin, "__file__", None) == CONFTEST]
  return module


@pytest.fixture
def session(pytester, conftest, monkeypatch, tmp_path):
  """session(**files): the outcome (a pytester.RunResult) of a pytest
  session over test files {name: source} with tests/conftest.py's hooks
  and fixtures, run in this process, counting its processes in a folder of
  its own."""
  counted = tmp_path / "started"
  counted.mkdir()
  monkeypatch.setenv(conftest.PROCESSES, str(counted))

  def run(**files):
    pytester.makepyfile(**files)
    return pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:jaxtyping",
        *[f"{name}.py" for name in files], plugins=[conftest])
  run.counted = counted
  return run


SKIPS = """
import pytest

def test_runs():
  pass

def test_skips():
  pytest.skip("no device here")

@pytest.mark.skipif(True, reason="never on this host")
def test_skipped_by_a_mark():
  pass

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_to_fail():
  assert False
"""

SKIPPED_FILE = """
import pytest

pytest.skip("none of this file here", allow_module_level=True)
"""


@pytest.mark.parametrize("ci", [None, "true"])
def test_on_ci_a_skip_fails(session, monkeypatch, ci):
  """With CI=true a test that would skip fails, saying where and why, and
  a file that would skip is an error of the collection, which stops the
  session; an expected failure stays one. Elsewhere they skip."""
  if ci is None:
    monkeypatch.delenv("CI", raising=False)
  else:
    monkeypatch.setenv("CI", ci)
  tests = session(test_skips=SKIPS)
  whole_file = session(test_skipped_file=SKIPPED_FILE)
  if ci is None:
    tests.assert_outcomes(passed=1, skipped=2, xfailed=1)
    whole_file.assert_outcomes(skipped=1)
    assert tests.ret == pytest.ExitCode.OK
    assert whole_file.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    return
  # A skip in the test's call fails it; one in its setup (a mark's) is an
  # error of the setup.
  tests.assert_outcomes(passed=1, failed=1, errors=1, xfailed=1)
  assert tests.ret == pytest.ExitCode.TESTS_FAILED
  whole_file.assert_outcomes(errors=1)
  assert whole_file.ret == pytest.ExitCode.INTERRUPTED
  said = "skipped, which CI (CI=true) does not allow: "
  output = tests.stdout.str() + whole_file.stdout.str()
  for where in ("test_skips.py:7: Skipped: no device here",
                "test_skips.py:9: Skipped: never on this host",
                "test_skipped_file.py:3: Skipped: none of this file here"):
    assert said in output and where in output, output


# The inner sessions' tests start processes as far as the count goes: each
# writes the record that a started process's sitecustomize writes.
STARTS = """
import os, subprocess, sys
import pytest

def start(count):
  for i in range(count):
    name = f"simulated-{os.getpid()}-{id(start)}-{os.urandom(4).hex()}"
    with open(os.path.join(os.environ["VIT_JAX_TEST_PROCESSES"], name),
              "w") as record:
      record.write(os.environ["PYTEST_CURRENT_TEST"] + "\\nstarted")

def test_one():
  start(1)

def test_two():
  start(2)

@pytest.mark.processes(2)
def test_two_allowed():
  start(2)

# JAX warns at a fork of a process it runs in.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_forks_twice():
  for _ in range(2):
    child = os.fork()
    if child == 0:
      os._exit(0)
    os.waitpid(child, 0)

def test_a_python_without_the_environment():
  subprocess.run([sys.executable, "-c", "pass"],
                 env={"PATH": os.environ["PATH"]}, check=True)

def test_an_isolated_python():
  subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)

def test_a_python_without_site():
  os.waitpid(os.posix_spawn(sys.executable, [sys.executable, "-S", "-c",
                                             "pass"], os.environ), 0)
"""


def test_a_test_over_its_allowance_fails(session):
  """A test may start one Python process unless marked with more; a fork
  is one; a Python that would not be counted is refused before it starts
  (none of these starts one)."""
  result = session(test_starts=STARTS)
  result.assert_outcomes(passed=4, failed=3, errors=2)
  outcomes = {}
  for line in result.outlines:
    for outcome in ("PASSED", "FAILED", "ERROR"):
      if line.startswith(f"{outcome} test_starts.py::"):
        outcomes.setdefault(line.split("::")[1].split()[0], []).append(
            outcome)
  assert outcomes == {
      "test_two": ["ERROR"], "test_forks_twice": ["ERROR"],
      "test_a_python_without_the_environment": ["FAILED"],
      "test_an_isolated_python": ["FAILED"],
      "test_a_python_without_site": ["FAILED"]}, result.outlines
  output = result.stdout.str()
  assert ("2 Python processes started (0 of them forks), more than the 1 "
          "this test may start") in output
  assert ("2 Python processes started (2 of them forks), more than the 1 "
          "this test may start") in output
  assert output.count("would start without the tests' count of Python "
                      "processes") >= 3
  # The session's count: the processes by the test that started them.
  assert "  2 test_starts.py::test_forks_twice (forked)" in result.outlines
  assert "7 Python processes started" in result.outlines


def test_a_session_over_its_budget_fails(session, conftest, monkeypatch):
  three = """
def test_a():
  start(1)

def test_b():
  start(1)

def test_c():
  start(1)
"""
  start = STARTS[:STARTS.index("def test_one")]
  monkeypatch.setattr(conftest, "PROCESS_BUDGET", 3)
  result = session(test_three=start + three)
  result.assert_outcomes(passed=3)
  assert result.ret == pytest.ExitCode.OK
  assert "3 Python processes started" in result.outlines
  for record in session.counted.iterdir():
    record.unlink()
  monkeypatch.setattr(conftest, "PROCESS_BUDGET", 2)
  result = session(test_three=start + three)
  result.assert_outcomes(passed=3)  # Each within its own allowance,
  assert result.ret == pytest.ExitCode.TESTS_FAILED  # but not all three.
  assert "3 Python processes started" in result.outlines
  assert any(line.startswith("FAILED: more Python processes than the "
                             "session's budget of 2")
             for line in result.outlines), result.outlines


@pytest.fixture
def sitecustomize(conftest, monkeypatch, tmp_path):
  """The namespace of the sitecustomize that every process of the session
  runs, its functions defined and nothing installed."""
  monkeypatch.delenv(conftest.PROCESSES)
  site = tmp_path / "sitecustomize.py"
  namespace = {"__name__": "sitecustomize", "__file__": str(site)}
  exec(compile(conftest.SITECUSTOMIZE, str(site), "exec"), namespace)  # noqa: S102  # pylint: disable=exec-used
  return namespace


@pytest.mark.parametrize("argv, isolating", [
    (["python", "-I", "-c", "pass"], True),
    (["python", "-u", "-Es", "x.py"], True),
    (["python", "-W", "ignore", "-S", "-c", "pass"], True),
    (["python", "-Wignore", "-I"], True),
    (["python", "-P", "tests/gcs.py", "-I"], False),  # the script's -I
    (["python", "-c", "import sys", "-S"], False),
    (["python", "-X", "-I", "-m", "vit_jax.main"], False),  # -X's value
    (["python", "-m", "vit_jax.main", "-E"], False),
    (["python", "--check-hash-based-pycs", "always", "-E"], True),
    ([b"python", b"-I"], True),
])
def test_options_that_leave_the_count_out_are_seen(sitecustomize, argv,
                                                    isolating):
  assert sitecustomize["_isolating"](argv) is isolating


@pytest.mark.parametrize("program, python", [
    ("python", True), ("/usr/bin/python3.11", True), ("python3", True),
    ("bash", False), ("pythonista", False), ("/bin/sh", False),
    ("launch/local_pod.sh", False)])
def test_pythons_are_told_from_other_programs(sitecustomize, program,
                                              python):
  assert sitecustomize["_is_python"](program) is python
