"""The Cloud TPU and GKE scripts in launch/, through their --dry-run output.

No gcloud or xpk is needed: stand-ins that fail loudly come first on PATH,
so a command that escaped --dry-run could not reach a real project.
The remote shell commands are also run here, in a scratch HOME, with
stand-ins for sudo and python, to check what they would do on a worker.
launch/local_pod.sh is run here with stand-in interpreters, for its choice
of interpreter and its handling of exits and signals (tests/test_pod.py runs
it with the real program).
"""

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
import uuid

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
  for tool in ("gcloud", "xpk"):
    write_script(fake_bin / tool,
                 f'echo "real {tool} called: $*" >&2; exit 99')
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
  for script in [*SCRIPTS, "gke.sh"]:
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


def test_create_as_a_queued_resource_spot_or_reserved(env):
  base = ["--name=vit", "--zone=z", "--accelerator=v5p-128"]
  queued = ["gcloud", "compute", "tpus", "queued-resources", "create", "vit",
            "--zone=z", "--node-id=vit", "--accelerator-type=v5p-128",
            "--runtime-version=v2-alpha-tpuv5"]
  for extra, tail in [(["--queued"], []),
                      (["--queued", "--spot"], ["--spot"]),
                      (["--reserved"], ["--reserved"]),
                      (["--reserved", "--project=p"],
                       ["--project=p", "--reserved"])]:
    assert dry_run(env, "tpu_create.sh", *base, *extra) == [
        queued + tail], extra
  result = run(env, "tpu_create.sh", "--dry-run", *base, "--spot",
               "--reserved")
  assert result.returncode == 2 and result.stdout == ""
  assert "--spot and --reserved exclude each other" in result.stderr
  # Deleting the queued resource deletes its slice too.
  assert dry_run(env, "tpu_delete.sh", "--name=vit", "--zone=z",
                 "--queued") == [
      ["gcloud", "compute", "tpus", "queued-resources", "delete", "vit",
       "--zone=z", "--force", "--quiet"]]


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


# launch/gke.sh: xpk's commands for a GKE cluster of TPU slices.
GKE = ["--cluster=vit", "--zone=us-east5-b"]


def test_gke_creates_and_deletes_a_cluster_of_slices(env):
  assert dry_run(env, "gke.sh", "create", *GKE, "--tpu-type=tpu7x-256") == [
      ["xpk", "cluster", "create", *GKE, "--tpu-type=tpu7x-256",
       "--num-slices=1", "--on-demand"]]
  for capacity, flag in [(["--spot"], "--spot"),
                         (["--reservation=r1"], "--reservation=r1")]:
    assert dry_run(env, "gke.sh", "create", *GKE, "--tpu-type=v5p-1024",
                   "--num-slices=2", "--project=p", *capacity) == [
        ["xpk", "cluster", "create", *GKE, "--project=p",
         "--tpu-type=v5p-1024", "--num-slices=2", flag]]
  assert dry_run(env, "gke.sh", "stop", *GKE, "--workload=h14") == [
      ["xpk", "workload", "delete", *GKE, "--workload=h14"]]
  assert dry_run(env, "gke.sh", "delete", *GKE) == [
      ["xpk", "cluster", "delete", *GKE]]


def test_gke_runs_main_on_every_host_of_two_slices(env):
  [argv] = dry_run(env, "gke.sh", "run", *GKE, "--tpu-type=v5p-1024",
                   "--num-slices=2", "--workload=h14", "--max-restarts=3",
                   "--", *TRICKY_MAIN_ARGS, "--config.mesh.slices=2")
  command = argv.pop(argv.index(next(a for a in argv
                                     if a.startswith("--command="))))
  assert argv == ["xpk", "workload", "create", *GKE, "--workload=h14",
                  "--tpu-type=v5p-1024", "--num-slices=2",
                  "--base-docker-image=python:3.11", f"--script-dir={ROOT}",
                  "--max-restarts=3"]
  # Each host installs this checkout, then runs main with its arguments
  # intact through the container's shell.
  install, main = command[len("--command="):].split(" && ")
  assert shlex.split(install) == ["python", "-m", "pip", "install", "-q",
                                  ".[tpu]"]
  assert shlex.split(main) == ["python", "-m", "vit_jax.main",
                               *TRICKY_MAIN_ARGS, "--config.mesh.slices=2"]
  # An image that holds vit_jax runs main alone.
  [argv] = dry_run(env, "gke.sh", "run", *GKE, "--tpu-type=v6e-256",
                   "--workload=w", "--docker-image=gcr.io/p/vit:1", "--",
                   "--workdir=gs://b/w")
  assert argv[-2:] == ["--docker-image=gcr.io/p/vit:1",
                       "--command=python -m vit_jax.main --workdir=gs://b/w"]


@pytest.mark.parametrize("args,message", [
    ([], "missing the action"),
    (["start", *GKE], "unknown action start"),
    (["create", "--zone=z", "--tpu-type=v6e-8"], "missing required flag "
     "--cluster"),
    (["create", *GKE], "missing required flag --tpu-type"),
    (["create", *GKE, "--tpu-type=v5p-12k"], "invalid TPU type v5p-12k"),
    (["create", *GKE, "--tpu-type=v5p-8", "--num-slices=0"],
     "--num-slices=0: give a whole number"),
    (["create", *GKE, "--tpu-type=v5p-8", "--name=x"], "unknown flag --name"),
    (["stop", *GKE], "missing required flag --workload"),
    (["delete", *GKE, "--", "--workdir=gs://b/w"], "only run takes"),
    (["run", *GKE, "--tpu-type=v5p-8", "--workload=w", "--",
      "--config=c"], "missing --workdir=DIR"),
    (["run", *GKE, "--tpu-type=v5p-8", "--workload=w", "--",
      "--workdir=/tmp/w"], "the workdir must be a gs:// path"),
    (["run", *GKE, "--tpu-type=v5p-8", "--workload=w", "--max-restarts=x",
      "--", "--workdir=gs://b/w"], "--max-restarts=x: give a whole number"),
    (["create", *GKE, "--tpu-type=v5p-8", "--spot", "--reservation=r"],
     "--spot and --reservation exclude each other"),
    (["create", *GKE, "--tpu-type=v5p-8", "--reservation=r", "--spot"],
     "--reservation and --spot exclude each other"),
    (["stop", *GKE, "--workload=H14_run"], "--workload=H14_run: a lowercase"),
    (["stop", *GKE, "--workload=h14-"], "--workload=h14-: a lowercase"),
    (["stop", *GKE, f"--workload=w{'x' * 40}"], "40 characters at most"),
])
def test_gke_refuses_bad_usage_in_one_line(env, args, message):
  result = run(env, "gke.sh", "--dry-run", *args)
  assert result.returncode == 2 and result.stdout == ""
  assert len(result.stderr.splitlines()) == 1 and message in result.stderr


def test_gke_without_dry_run_a_missing_xpk_is_named(env, tmp_path):
  for tool in ["basename", "dirname"]:
    (tmp_path / tool).symlink_to(shutil.which(tool))
  result = subprocess.run(
      [shutil.which("bash"), str(LAUNCH / "gke.sh"), "delete", *GKE],
      env=dict(os.environ, PATH=str(tmp_path)), capture_output=True,
      text=True, timeout=30)
  assert result.returncode == 1
  assert "xpk not found on PATH; pip install xpk" in result.stderr
  assert run(env, "gke.sh", "--help").stdout.startswith(
      "Usage: gke.sh create --cluster=C")


# launch/local_pod.sh, with stand-in interpreters in a scratch copy of the
# checkout's layout: the script cds to the directory above its own.
# The range local_pod.sh picks the coordinator's port from.
PORTS = range(20000, 32000)


def pod_checkout(tmp_path):
  """A scratch checkout holding launch/local_pod.sh, and a log directory."""
  (tmp_path / "launch").mkdir()
  shutil.copy2(LAUNCH / "local_pod.sh", tmp_path / "launch" / "local_pod.sh")
  log = tmp_path / "log"
  log.mkdir()
  return tmp_path, log


def write_python(path, log, name, behaviour=None):
  """A stand-in interpreter called `name`. With -m vit_jax.main ...
  --process_id=I it records its arguments, environment and pid under `log`,
  says hello, then runs behaviour[I] (a shell snippet; default: exit 0).
  Any call is recorded in `log`/calls, by its last argument."""
  cases = "".join(f"  {i}) {body};;\n"
                  for i, body in (behaviour or {}).items())
  path.parent.mkdir(parents=True, exist_ok=True)
  write_script(path, f"""
log={shlex.quote(str(log))}
i=${{@: -1}}; i=${{i#--process_id=}}
echo "{name} $i" >> "$log/calls"
printf '%s\\0' "$@" > "$log/argv_$i"
echo "$JAX_PLATFORMS|$XLA_FLAGS" > "$log/env_$i"
echo "hello from $i"
case $i in
{cases}  *) exit 0;;
esac
""")


def main_argv(num_processes, i, *args, port):
  return ["-m", "vit_jax.main", *args,
          f"--coordinator_address=127.0.0.1:{port}",
          f"--num_processes={num_processes}", f"--process_id={i}"]


def recorded_argv(log, i):
  return (log / f"argv_{i}").read_text().split("\0")[:-1]


def coordinator_port(log, num_processes):
  """The port every process of the pod was given (one for all, in PORTS)."""
  ports = set()
  for i in range(num_processes):
    (address,) = [a for a in recorded_argv(log, i)
                  if a.startswith("--coordinator_address=")]
    ports.add(int(address.rsplit(":", 1)[1]))
  (port,) = ports
  assert port in PORTS
  return port


def pod_env(fake_bin=None, python=None):
  env = dict(os.environ)
  env.pop("PYTHON", None)
  if python is not None:
    env["PYTHON"] = python
  if fake_bin is not None:
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
  return env


def default_signals():
  # As from a user's shell: a signal ignored when bash starts cannot be
  # trapped, and earlier tests in this pytest worker may have left SIGINT
  # ignored, which a child inherits.
  for number in (signal.SIGINT, signal.SIGTERM):
    signal.signal(number, signal.SIG_DFL)


def start_local_pod(checkout, num_processes, args, env):
  return subprocess.Popen(
      [str(checkout / "launch" / "local_pod.sh"), str(num_processes), "2",
       "--", *args], cwd="/", env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)


def run_local_pod(checkout, num_processes, args, env, timeout=60):
  pod = start_local_pod(checkout, num_processes, args, env)
  start = time.monotonic()
  stdout, stderr = pod.communicate(timeout=timeout)
  return pod.returncode, stdout, stderr, time.monotonic() - start


@pytest.mark.parametrize("venv,python_env,expected", [
    ("executable", None, "venv"),       # PYTHON unset: the checkout's .venv.
    ("executable", "chosen", "chosen"),  # PYTHON wins over .venv.
    (None, None, "python3"),            # No .venv: python3 from PATH.
    ("not executable", None, "python3"),
])
def test_local_pod_interpreter(tmp_path, venv, python_env, expected):
  checkout, log = pod_checkout(tmp_path)
  fake_bin = tmp_path / "bin"
  write_python(fake_bin / "python3", log, "python3")
  write_python(tmp_path / "chosen" / "python", log, "chosen")
  if venv:
    write_python(checkout / ".venv" / "bin" / "python", log, "venv")
    if venv == "not executable":
      (checkout / ".venv" / "bin" / "python").chmod(0o644)
  python = str(tmp_path / "chosen" / "python") if python_env else None
  code, stdout, stderr, _ = run_local_pod(
      checkout, 2, ["--config=c.py"], pod_env(fake_bin, python))
  assert code == 0, stderr
  calls = (log / "calls").read_text().splitlines()
  # The processes alone: the port is found without an interpreter.
  assert sorted(calls) == [f"{expected} 0", f"{expected} 1"]
  port = coordinator_port(log, 2)
  for i in range(2):
    assert recorded_argv(log, i) == main_argv(2, i, "--config=c.py",
                                              port=port)
    assert f"[{i}] hello from {i}" in stdout.splitlines()


def test_local_pod_all_exit_0(tmp_path):
  checkout, log = pod_checkout(tmp_path)
  write_python(checkout / ".venv" / "bin" / "python", log, "venv")
  env = pod_env(python=None)
  env["XLA_FLAGS"] = "--xla_foo=1 --xla_force_host_platform_device_count=7"
  code, stdout, stderr, elapsed = run_local_pod(
      checkout, 3, ["--config=c.py", "--workdir=w"], env)
  assert code == 0, stderr
  assert elapsed < 10
  assert "[pod]" not in stderr
  assert sorted(stdout.splitlines()) == [f"[{i}] hello from {i}"
                                         for i in range(3)]
  port = coordinator_port(log, 3)
  for i in range(3):
    assert recorded_argv(log, i) == main_argv(3, i, "--config=c.py",
                                              "--workdir=w", port=port)
    platforms, flags = (log / f"env_{i}").read_text().strip().split("|")
    assert platforms == "cpu"
    assert flags.split() == ["--xla_foo=1",
                             "--xla_force_host_platform_device_count=2"]


def test_local_pod_a_process_that_exits_at_once_sets_the_code(tmp_path):
  """Process 2 exits with code 3 as soon as it starts, likely before the pod
  waits; 0 and 1 would run for a minute. The pod stops them (bash reaps
  them while it sleeps between SIGTERM and SIGKILL, before it waits for
  them) and exits with 3."""
  checkout, log = pod_checkout(tmp_path)
  marker = f"local-pod-test-{uuid.uuid4().hex}"
  runner = f'exec -a {marker} sleep 60'
  write_python(checkout / ".venv" / "bin" / "python", log, "venv",
               {0: runner, 1: runner, 2: "exit 3"})
  code, stdout, stderr, elapsed = run_local_pod(checkout, 3, ["--x"],
                                                pod_env())
  assert code == 3, stderr
  assert elapsed < 20
  argv = recorded_argv(log, 2)
  assert argv == main_argv(3, 2, "--x", port=int(argv[-3].rsplit(":")[1]))
  assert "[2] hello from 2" in stdout.splitlines()
  [line] = [x for x in stderr.splitlines() if x.startswith("[pod]")]
  assert line.startswith("[pod] process 2 (pid ")
  assert line.endswith(" exited with code 3; stopping the others")
  assert "unbound variable" not in stderr
  assert "no such job" not in stderr
  left = subprocess.run(["pgrep", "-f", "--", marker], capture_output=True,
                        text=True).stdout.split()
  assert not left


@pytest.mark.parametrize("signal_name", ["TERM", "INT"])
def test_local_pod_forwards_a_signal_and_exits_with_the_processes(
    tmp_path, signal_name):
  """Each process, told by the pod, stops with code 0: so does the pod."""
  checkout, log = pod_checkout(tmp_path)
  runner = ('trap \'echo "$i" >> "$log/told"; exit 0\' TERM; '
            'touch "$log/ready_$i"; while :; do sleep 0.05; done')
  write_python(checkout / ".venv" / "bin" / "python", log, "venv",
               {0: runner, 1: runner})
  pod = start_local_pod(checkout, 2, ["--x"], pod_env())
  deadline = time.monotonic() + 30
  while not all((log / f"ready_{i}").exists() for i in range(2)):
    assert pod.poll() is None and time.monotonic() < deadline
    time.sleep(0.02)
  pod.send_signal(getattr(signal, f"SIG{signal_name}"))
  stdout, stderr = pod.communicate(timeout=30)
  assert pod.returncode == 0, stderr
  assert sorted((log / "told").read_text().split()) == ["0", "1"]
  port = coordinator_port(log, 2)
  for i in range(2):
    assert recorded_argv(log, i) == main_argv(2, i, "--x", port=port)
    assert f"[{i}] hello from {i}" in stdout.splitlines()

