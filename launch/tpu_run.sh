#!/usr/bin/env bash
# Starts vit_jax.main in the background on every worker of a slice at once.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.sh"

USAGE="Usage: $PROG --name=NAME --zone=ZONE [--project=P] [--dry-run] \\
         -- --config=CONFIG --workdir=gs://BUCKET/DIR [--config.KEY=VALUE ...]

Runs python -m vit_jax.main with the arguments after -- on every worker of
slice NAME at once, in the background, logging to ~/vit_jax_run.log on each
(see tpu_logs.sh). Every host runs the same program: that is how a
multi-host JAX job runs. Run it again with the same arguments to resume
from the workdir's latest checkpoint.
--dry-run prints the gcloud command instead of running it."

while (( $# )); do
  arg=$1
  shift
  [[ "$arg" == -- ]] && break
  parse_common_flag "$arg" ||
    usage_error "unknown flag $arg (vit_jax.main's arguments go after --)"
done
MAIN_ARGS=("$@")
require_name_and_zone

WORKDIR=$(workdir_of "${MAIN_ARGS[@]}")
[[ -n "$WORKDIR" ]] || usage_error "missing --workdir=DIR after --"
# Each host writes its part of every checkpoint into the workdir, so on a
# pod all of them must see the same one: a local path would split it.
if [[ "$WORKDIR" != gs://* ]]; then
  echo "$PROG: warning: --workdir=$WORKDIR is not a gs:// path; on a" \
    "multi-host slice every host must share the workdir" >&2
fi
location_flags

# The arguments are quoted once more, for the remote shell.
main="$REMOTE_VENV/bin/python -m vit_jax.main $(shell_join "${MAIN_ARGS[@]}")"
# nohup and redirecting all three streams let the run outlive the ssh
# session, which returns at once.
ssh_all "cd $REMOTE_DIR && nohup $main > $REMOTE_LOG 2>&1 < /dev/null &"
