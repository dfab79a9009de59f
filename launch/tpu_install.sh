#!/usr/bin/env bash
# Ships the repository's committed HEAD to every worker of a slice and
# installs it there, replacing any older copy.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.sh"

USAGE="Usage: $PROG --name=NAME --zone=ZONE [--project=P] [--dry-run]

Packs the committed HEAD (not uncommitted changes) with git archive, copies
it to every worker of slice NAME, unpacks it into ~/vit_jax and installs it
with its TPU extras into the virtualenv ~/vit_jax_venv.
--dry-run prints the commands instead of running them."

for arg in "$@"; do
  parse_common_flag "$arg" || usage_error "unknown flag $arg"
done
require_name_and_zone
location_flags

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
TARBALL=/tmp/vit_jax.tar.gz

if [[ -n "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no)" ]]; then
  echo "$PROG: warning: uncommitted changes are not shipped, only HEAD" >&2
fi

# The TPU images run Ubuntu 22.04, whose python3 (3.10) is older than the
# package needs, and newer Ubuntus refuse pip installs outside a venv: so the
# venv is made with python3 if it is recent enough, else with python3.11.
make_venv="if [ ! -x $REMOTE_VENV/bin/python ]; then
py=python3.11; python3 -c \"import sys; sys.exit(sys.version_info < (3, 11))\" && py=python3;
sudo apt-get -qq -o DPkg::Lock::Timeout=600 update &&
sudo DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600 install -y \$py-venv &&
\$py -m venv $REMOTE_VENV; fi"
remote_steps=(
  "rm -rf $REMOTE_DIR"
  "mkdir -p $REMOTE_DIR"
  "tar -xzf ~/vit_jax.tar.gz -C $REMOTE_DIR"
  "${make_venv//$'\n'/ }"
  "cd $REMOTE_DIR"
  "$REMOTE_VENV/bin/python -m pip install -q --upgrade pip"
  "$REMOTE_VENV/bin/python -m pip install -e \".[tpu]\""
)
remote=$(printf ' && %s' "${remote_steps[@]}")

run_cmd git -C "$REPO_ROOT" archive --format=tar.gz -o "$TARBALL" HEAD
run_cmd gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME":vit_jax.tar.gz \
  --worker=all "${LOCATION[@]}"
ssh_all "${remote# && }"
