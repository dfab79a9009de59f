#!/usr/bin/env bash
# Deletes a TPU VM slice, which stops its billing; the GCS workdir stays.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.sh"

USAGE="Usage: $PROG --name=NAME --zone=ZONE [--project=P] [--dry-run]

Deletes the TPU VM slice NAME without asking for confirmation. Whatever its
workers hold on local disk is lost; a gs:// workdir is not touched.
--dry-run prints the gcloud command instead of running it."

for arg in "$@"; do
  parse_common_flag "$arg" || usage_error "unknown flag $arg"
done
require_name_and_zone
location_flags

run_cmd gcloud compute tpus tpu-vm delete "$NAME" "${LOCATION[@]}" --quiet
