#!/usr/bin/env bash
# Shows the end of the run's log on every worker of a slice.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.sh"

USAGE="Usage: $PROG --name=NAME --zone=ZONE [--project=P] [--lines=N] [--dry-run]

Prints, for every worker of slice NAME, its hostname and the last N lines
(default 50) of ~/vit_jax_run.log, the log that tpu_run.sh starts.
--dry-run prints the gcloud command instead of running it."

LINES=50
for arg in "$@"; do
  parse_common_flag "$arg" && continue
  case "$arg" in
    --lines=*) LINES=${arg#*=} ;;
    --lines) usage_error "--lines takes a value: --lines=N" ;;
    *) usage_error "unknown flag $arg" ;;
  esac
done
require_name_and_zone
[[ "$LINES" =~ ^[1-9][0-9]*$ ]] || usage_error "--lines must be a positive integer, got '$LINES'"
location_flags

# The header tells the workers apart: their output arrives in one stream.
ssh_all "echo \"===== \$(hostname) =====\"; tail -n $LINES $REMOTE_LOG"
