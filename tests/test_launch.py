"""The Cloud TPU scripts in launch/, through their --dry-run output.

No gcloud is needed: a stand-in `gcloud` that fails loudly comes first on
PATH, so a command that escaped --dry-run could not reach a real project.
The remote shell commands are also run here, in a scratch HOME, with
stand-ins for sudo and python, to check what they would do on a worker.
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import tarfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
SCRIPTS = ["tpu_create.sh", "tpu_install.sh", "tpu_run.sh", "tpu_logs.sh",
           "tpu_delete.sh"]
# The least each script needs beyond --name and --zone.
EXTRA_ARGS = {"tpu_create.sh": ["--accelerator=v3-8"],
              "tpu_run.sh": ["--", "--workdir=gs://b/w"]}
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "vit", "--worker=all",
       "--zone=europe-west4-a"]
TRICKY_MAIN_ARGS = [
    "--config=configs/table2/pretrain.py:L/16,i21k",
    "--workdir=gs://bucket/runs/l16 i21k",
    "--config.model.dtype=bfloat16",
    "--config.data_dir=gs://bucket/tensorflow_datasets",
    "--config.dataset=it's",
    "--config.augment=flip,inception_crop",
    "$HOME;*&&`x`\"",
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  fake_bin = tmp_path_factory.mktemp("fake_gcloud")
  write_script(fake_bin / "gcloud",
               'echo "real gcloud called: $*" >&2; exit 99')
  return dict(os.environ, PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}")


def write_script(path, body):
  path.write_text(f"#!/bin/bash\n{body}\n")
  path.chmod(0o755)


def run(env, script, *args):
  return subprocess.run([str(LAUNCH / script), *args], env=env,
                        capture_output=True, text=True, timeout=30)


def dry_run(env, script, *args):
  """The printed commands, each split into its arguments."""
  result = run(env, script, "--dry-run", *args)
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines()]


def remote_command(argv):
  """The shell command of a `gcloud ... ssh --command=...` argument list."""
  flag, command = argv[-1].split("=", 1)
  assert flag == "--command"
  return command


def run_remotely(command, home, fake_bin):
  """Runs a --command as a worker's login shell would, in a scratch HOME."""
  env = dict(os.environ, HOME=str(home),
             PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
  return subprocess.run(["bash", "-c", command], cwd=home, env=env,
                        capture_output=True, text=True, timeout=30)


def test_only_the_sourced_helper_is_not_executable():
  for script in SCRIPTS:
    assert os.access(LAUNCH / script, os.X_OK), script
  assert not os.access(LAUNCH / "tpu_common.sh", os.X_OK)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(env, script):
  result = run(env, script, "--help")
  assert result.returncode == 0
  assert result.stdout.startswith(f"Usage: {script} --name=NAME --zone=ZONE")


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("missing", ["--name", "--zone"])
def test_missing_required_flag_fails_naming_it(env, script, missing):
  args = [a for a in ["--name=vit", "--zone=z"] if not a.startswith(missing)]
  result = run(env, script, "--dry-run", *args, *EXTRA_ARGS.get(script, []))
  assert result.returncode == 2
  assert result.stdout == ""
  assert len(result.stderr.splitlines()) == 1
  assert f"missing required flag {missing}" in result.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_unknown_flag_fails_naming_it(env, script):
  result = run(env, script, "--dry-run", "--name=vit", "--zone=z", "--nmae=x",
               *EXTRA_ARGS.get(script, []))
  assert result.returncode == 2
  assert result.stdout == ""
  assert "unknown flag --nmae=x" in result.stderr


def test_a_value_flag_without_its_value_fails(env):
  result = run(env, "tpu_delete.sh", "--dry-run", "--name", "vit", "--zone=z")
  assert result.returncode == 2
  assert "--name takes a value" in result.stderr


def test_without_dry_run_a_missing_gcloud_is_named(tmp_path):
  # Only what the script needs besides gcloud is on PATH.
  for tool in ["basename", "dirname"]:
    (tmp_path / tool).symlink_to(shutil.which(tool))
  result = subprocess.run(
      [shutil.which("bash"), str(LAUNCH / "tpu_delete.sh"), "--name=vit",
       "--zone=z"], env=dict(os.environ, PATH=str(tmp_path)),
      capture_output=True, text=True, timeout=30)
  assert result.returncode == 1
  assert "gcloud not found on PATH" in result.stderr


def test_create(env):
  assert dry_run(env, "tpu_create.sh", "--name=vit", "--zone=europe-west4-a",
                 "--accelerator=v3-32") == [
      ["gcloud", "compute", "tpus", "tpu-vm", "create", "vit",
       "--zone=europe-west4-a", "--accelerator-type=v3-32",
       "--version=tpu-ubuntu2204-base"]]


def test_create_project_and_spot_only_when_given(env):
  base = ["--name=vit", "--zone=z", "--accelerator=v4-8"]
  for extra, tail in [([], []),
                      (["--project=p"], ["--project=p"]),
                      (["--spot"], ["--spot"]),
                      (["--spot", "--project=p"], ["--project=p", "--spot"])]:
    [argv] = dry_run(env, "tpu_create.sh", *base, *extra)
    assert argv[9:] == tail, extra


@pytest.mark.parametrize("accelerator,version", [
    ("v2-8", "tpu-ubuntu2204-base"),
    ("v3-2048", "tpu-ubuntu2204-base"),
    ("v4-4096", "tpu-ubuntu2204-base"),
    ("v5litepod-1", "v2-alpha-tpuv5-lite"),
    ("v5p-8192", "v2-alpha-tpuv5"),
    ("v6e-256", "v2-alpha-tpuv6e"),
])
def test_create_default_runtime_by_generation(env, accelerator, version):
  [argv] = dry_run(env, "tpu_create.sh", "--name=vit", "--zone=z",
                   f"--accelerator={accelerator}")
  assert argv[7:] == [f"--accelerator-type={accelerator}",
                      f"--version={version}"]


def test_create_explicit_runtime(env):
  [argv] = dry_run(env, "tpu_create.sh", "--name=vit", "--zone=z",
                   "--accelerator=v6e-8", "--version=v2-alpha-tpuv6e-next")
  assert argv[8] == "--version=v2-alpha-tpuv6e-next"


@pytest.mark.parametrize("accelerator", [
    "v3-12", "v9-8", "v3-16", "v2-1024", "v4-4", "v4-12", "v5p-12288",
    "v5litepod-2", "v6e-512", "v3-08", "v3", "v3-", "tpu-v3-8"])
def test_create_rejects_invalid_accelerator(env, accelerator):
  result = run(env, "tpu_create.sh", "--dry-run", "--name=vit", "--zone=z",
               f"--accelerator={accelerator}")
  assert result.returncode == 2
  assert result.stdout == ""
  assert f"invalid accelerator type {accelerator};" in result.stderr
  for form in ["v2-{8,32,64,128,256,512}",
               "v3-{8,32,64,128,256,512,1024,2048}",
               "v4-N (N a power of two, 8..4096)",
               "v5litepod-{1,4,8,16,32,64,128,256}",
               "v5p-N (N a power of two, 8..8192)",
               "v6e-{1,4,8,16,32,64,128,256}"]:
    assert form in result.stderr


@pytest.mark.parametrize("project", [[], ["--project=p"]])
def test_install(env, project):
  archive, scp, ssh = dry_run(env, "tpu_install.sh", "--name=vit",
                              "--zone=europe-west4-a", *project)
  assert archive == ["git", "-C", str(ROOT), "archive", "--format=tar.gz",
                     "-o", "/tmp/vit_jax.tar.gz", "HEAD"]
  assert scp == ["gcloud", "compute", "tpus", "tpu-vm", "scp",
                 "/tmp/vit_jax.tar.gz", "vit:vit_jax.tar.gz", "--worker=all",
                 "--zone=europe-west4-a", *project]
  assert ssh[:-1] == SSH + project
  command = remote_command(ssh)
  assert command.startswith(
      "rm -rf ~/vit_jax && mkdir -p ~/vit_jax && "
      "tar -xzf ~/vit_jax.tar.gz -C ~/vit_jax && ")
  assert command.endswith(
      " && cd ~/vit_jax && ~/vit_jax_venv/bin/python -m pip install -q "
      "--upgrade pip && ~/vit_jax_venv/bin/python -m pip install -e "
      '".[tpu]"')


def test_install_on_a_worker(env, tmp_path):
  """Replaces an older copy; makes the venv with python3.11 if python3 is
  older, once; then installs into it from the new copy."""
  [*_, ssh] = dry_run(env, "tpu_install.sh", "--name=vit", "--zone=z")
  home, fake_bin, log = tmp_path / "home", tmp_path / "bin", tmp_path / "log"
  home.mkdir()
  fake_bin.mkdir()
  (tmp_path / "new").mkdir()
  (tmp_path / "new" / "pyproject.toml").write_text("")
  with tarfile.open(home / "vit_jax.tar.gz", "w:gz") as tar:
    tar.add(tmp_path / "new" / "pyproject.toml", arcname="pyproject.toml")
  (home / "vit_jax" / "stale").mkdir(parents=True)
  write_script(fake_bin / "sudo", f'echo "sudo $*" >> {log}')
  write_script(fake_bin / "python3", "exit 1")  # Reports a version < 3.11.
  venv_python = f'echo "venv python $* in $PWD" >> {log}'
  write_script(fake_bin / "python3.11", f"""
echo "python3.11 $*" >> {log}
mkdir -p "$3/bin"
echo '{venv_python}' > "$3/bin/python"
chmod +x "$3/bin/python"
""")
  command = remote_command(ssh)
  for _ in range(2):
    result = run_remotely(command, home, fake_bin)
    assert result.returncode == 0, result.stderr
  assert sorted(os.listdir(home / "vit_jax")) == ["pyproject.toml"]
  steps = [
      "sudo apt-get -qq -o DPkg::Lock::Timeout=600 update",
      "sudo DEBIAN_FRONTEND=noninteractive apt-get -qq -o "
      "DPkg::Lock::Timeout=600 install -y python3.11-venv",
      f"python3.11 -m venv {home}/vit_jax_venv",
  ] + 2 * [
      f"venv python -m pip install -q --upgrade pip in {home}/vit_jax",
      f"venv python -m pip install -e .[tpu] in {home}/vit_jax",
  ]
  assert log.read_text().splitlines() == steps


def test_run(env):
  [argv] = dry_run(env, "tpu_run.sh", "--name=vit", "--zone=europe-west4-a",
                   "--", "--config=configs/digits.py", "--workdir=gs://b/w")
  assert argv[:-1] == SSH
  assert remote_command(argv) == (
      "cd ~/vit_jax && nohup ~/vit_jax_venv/bin/python -m vit_jax.main "
      "--config=configs/digits.py --workdir=gs://b/w "
      "> ~/vit_jax_run.log 2>&1 < /dev/null &")


def test_run_passes_main_arguments_intact(env):
  [argv] = dry_run(env, "tpu_run.sh", "--name=vit", "--zone=europe-west4-a",
                   "--project=p", "--", *TRICKY_MAIN_ARGS)
  assert argv[:-1] == SSH + ["--project=p"]
  command = remote_command(argv)
  head = "cd ~/vit_jax && nohup ~/vit_jax_venv/bin/python -m vit_jax.main "
  tail = " > ~/vit_jax_run.log 2>&1 < /dev/null &"
  assert command.startswith(head) and command.endswith(tail)
  assert shlex.split(command[len(head):-len(tail)]) == TRICKY_MAIN_ARGS


def test_run_on_a_worker_gets_main_arguments_intact(env, tmp_path):
  [argv] = dry_run(env, "tpu_run.sh", "--name=vit", "--zone=z", "--",
                   *TRICKY_MAIN_ARGS)
  home = tmp_path / "home"
  (home / "vit_jax").mkdir(parents=True)
  (home / "vit_jax_venv" / "bin").mkdir(parents=True)
  # NUL-separated, so any argument survives the round trip.
  write_script(home / "vit_jax_venv" / "bin" / "python",
               "printf '%s\\0' \"$PWD\" \"$@\" > ~/argv.tmp; "
               "mv ~/argv.tmp ~/argv")
  result = run_remotely(remote_command(argv), home, tmp_path)
  assert result.returncode == 0, result.stderr
  for _ in range(100):  # The run goes to the background.
    if (home / "argv").exists():
      break
    time.sleep(0.05)
  received = (home / "argv").read_text().split("\0")[:-1]
  assert received == [str(home / "vit_jax"), "-m", "vit_jax.main",
                      *TRICKY_MAIN_ARGS]


def test_run_requires_workdir(env):
  result = run(env, "tpu_run.sh", "--dry-run", "--name=vit", "--zone=z", "--",
               "--config=configs/digits.py")
  assert result.returncode == 2
  assert result.stdout == ""
  assert "missing --workdir" in result.stderr


def test_run_warns_about_a_local_workdir(env):
  for workdir, warns in [("gs://b/w", False), ("/tmp/w", True)]:
    result = run(env, "tpu_run.sh", "--dry-run", "--name=vit", "--zone=z",
                 "--", "--workdir", workdir)
    assert result.returncode == 0
    assert ("warning" in result.stderr) == warns
    assert (f"--workdir={workdir} is not a gs:// path" in result.stderr
            ) == warns


def test_run_main_arguments_go_after_the_separator(env):
  result = run(env, "tpu_run.sh", "--dry-run", "--name=vit", "--zone=z",
               "--workdir=gs://b/w")
  assert result.returncode == 2
  assert "after --" in result.stderr


@pytest.mark.parametrize("lines,expected", [([], 50), (["--lines=7"], 7)])
def test_logs(env, lines, expected):
  [argv] = dry_run(env, "tpu_logs.sh", "--name=vit",
                   "--zone=europe-west4-a", *lines)
  assert argv[:-1] == SSH
  assert remote_command(argv) == (
      f'echo "===== $(hostname) ====="; tail -n {expected} ~/vit_jax_run.log')


def test_logs_on_a_worker(env, tmp_path):
  [argv] = dry_run(env, "tpu_logs.sh", "--name=vit", "--zone=z", "--lines=2")
  (tmp_path / "vit_jax_run.log").write_text("one\ntwo\nthree\n")
  write_script(tmp_path / "hostname", "echo t1v-worker-3")
  result = run_remotely(remote_command(argv), tmp_path, tmp_path)
  assert result.stdout == "===== t1v-worker-3 =====\ntwo\nthree\n"


@pytest.mark.parametrize("lines", ["0", "-3", "x", ""])
def test_logs_rejects_bad_line_counts(env, lines):
  result = run(env, "tpu_logs.sh", "--dry-run", "--name=vit", "--zone=z",
               f"--lines={lines}")
  assert result.returncode == 2
  assert "--lines" in result.stderr


@pytest.mark.parametrize("project", [[], ["--project=p"]])
def test_delete(env, project):
  assert dry_run(env, "tpu_delete.sh", "--name=vit", "--zone=europe-west4-a",
                 *project) == [
      ["gcloud", "compute", "tpus", "tpu-vm", "delete", "vit",
       "--zone=europe-west4-a", *project, "--quiet"]]


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_runs_nothing(env, script):
  result = run(env, script, "--dry-run", "--name=vit", "--zone=z",
               *EXTRA_ARGS.get(script, []))
  assert result.returncode == 0
  assert "real gcloud called" not in result.stderr
  assert all(line.startswith(("gcloud ", "git "))
             for line in result.stdout.splitlines())
