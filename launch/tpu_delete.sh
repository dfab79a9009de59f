#!/usr/bin/env bash
# Deletes a TPU VM slice, which stops its billing; the GCS workdir stays.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.sh"

USAGE="Usage: $PROG --name=NAME --zone=ZONE [--project=P] [--queued] [--dry-run]

Deletes the TPU VM slice NAME without asking for confirmation. Whatever its
workers hold on local disk is lost; a gs:// workdir is not touched.
--queued deletes the queued resource NAME (tpu_create.sh --queued) and its
slice with it.
--dry-run prints the gcloud command instead of running it."

QUEUED=0
for arg in "$@"; do
  parse_common_flag "$arg" && continue
  case "$arg" in
    --queued) QUEUED=1 ;;
    *) usage_error "unknown flag $arg" ;;
  esac
done
require_name_and_zone
location_flags

if (( QUEUED )); then
  run_cmd gcloud compute tpus queued-resources delete "$NAME" \
    "${LOCATION[@]}" --force --quiet
else
  run_cmd gcloud compute tpus tpu-vm delete "$NAME" "${LOCATION[@]}" --quiet
fi
