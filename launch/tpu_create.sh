#!/usr/bin/env bash
# Creates a Cloud TPU VM slice (one VM per host, all named NAME).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.sh"

USAGE="Usage: $PROG --name=NAME --zone=ZONE --accelerator=TYPE [--project=P]
       [--version=RUNTIME] [--queued] [--spot | --reserved] [--dry-run]

Creates the TPU VM slice NAME, e.g. --accelerator=v3-32 (4 hosts).
--version defaults to the runtime recommended for the TPU generation.
--queued asks for it as a Cloud TPU queued resource, also named NAME,
which waits in line until the slice is free (how v5e, v5p and v6e slices
are mostly obtained); tpu_delete.sh --queued deletes both.
--spot asks for a Spot slice: much cheaper, but it can be preempted.
--reserved takes it from the project's reservation (a queued resource).
--dry-run prints the gcloud command instead of running it."

VALID_TYPES="v2-{8,32,64,128,256,512}, v3-{8,32,64,128,256,512,1024,2048}, \
v4-N (N a power of two, 8..4096), v5litepod-{1,4,8,16,32,64,128,256}, \
v5p-N (N a power of two, 8..8192), v6e-{1,4,8,16,32,64,128,256}"

# Sizes are the slice shapes Cloud TPU offers; checked here so that a typo
# fails at once rather than after a slow round trip to the API.
valid_accelerator() {
  local gen=${1%-*} n=${1##*-}
  # No leading zeros (gcloud would get "v3-08"), nor digits enough to overflow.
  [[ "$1" == *-* && "$n" =~ ^[1-9][0-9]{0,4}$ ]] || return 1
  case "$gen" in
    v2) [[ " 8 32 64 128 256 512 " == *" $n "* ]] ;;
    v3) [[ " 8 32 64 128 256 512 1024 2048 " == *" $n "* ]] ;;
    v4) power_of_two_between "$n" 8 4096 ;;
    v5p) power_of_two_between "$n" 8 8192 ;;
    v5litepod | v6e) [[ " 1 4 8 16 32 64 128 256 " == *" $n "* ]] ;;
    *) return 1 ;;
  esac
}

power_of_two_between() {
  (( $1 >= $2 && $1 <= $3 && ($1 & ($1 - 1)) == 0 ))
}

default_version() {
  case "${1%-*}" in
    v2 | v3 | v4) echo tpu-ubuntu2204-base ;;
    v5litepod) echo v2-alpha-tpuv5-lite ;;
    v5p) echo v2-alpha-tpuv5 ;;
    v6e) echo v2-alpha-tpuv6e ;;
  esac
}

ACCELERATOR=""
VERSION=""
SPOT=0
QUEUED=0
RESERVED=0
for arg in "$@"; do
  parse_common_flag "$arg" && continue
  case "$arg" in
    --accelerator=*) ACCELERATOR=${arg#*=} ;;
    --version=*) VERSION=${arg#*=} ;;
    --spot) SPOT=1 ;;
    --queued) QUEUED=1 ;;
    --reserved) RESERVED=1 QUEUED=1 ;;
    --accelerator | --version) usage_error "$arg takes a value: $arg=VALUE" ;;
    *) usage_error "unknown flag $arg" ;;
  esac
done
require_name_and_zone
require_flag ACCELERATOR --accelerator
valid_accelerator "$ACCELERATOR" ||
  usage_error "invalid accelerator type $ACCELERATOR; valid types: $VALID_TYPES"
VERSION=${VERSION:-$(default_version "$ACCELERATOR")}
(( SPOT && RESERVED )) && usage_error "--spot and --reserved exclude each other"
location_flags

if (( QUEUED )); then
  # The node keeps the name NAME, so the other scripts reach it as usual.
  cmd=(gcloud compute tpus queued-resources create "$NAME" --zone="$ZONE"
    --node-id="$NAME" --accelerator-type="$ACCELERATOR"
    --runtime-version="$VERSION")
else
  cmd=(gcloud compute tpus tpu-vm create "$NAME" --zone="$ZONE"
    --accelerator-type="$ACCELERATOR" --version="$VERSION")
fi
if [[ -n "$PROJECT" ]]; then
  cmd+=(--project="$PROJECT")
fi
if (( SPOT )); then
  cmd+=(--spot)
fi
if (( RESERVED )); then
  cmd+=(--reserved)
fi
run_cmd "${cmd[@]}"
