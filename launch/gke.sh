#!/usr/bin/env bash
# Runs vit_jax on TPU slices of a GKE cluster through xpk (pip install xpk):
# one slice or several joined by the data-center network (multislice).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu_common.sh"

USAGE="Usage: $PROG create --cluster=C --zone=Z --tpu-type=T [--num-slices=N]
                  [--spot | --reservation=R] [--project=P] [--dry-run]
       $PROG run --cluster=C --zone=Z --tpu-type=T --workload=W
                  [--num-slices=N] [--docker-image=IMAGE] [--max-restarts=K]
                  [--project=P] [--dry-run]
                  -- --config=CONFIG --workdir=gs://BUCKET/DIR [...]
       $PROG stop --cluster=C --zone=Z --workload=W [--project=P] [--dry-run]
       $PROG delete --cluster=C --zone=Z [--project=P] [--dry-run]

create  makes cluster C with N slices of TPU type T (v5p-1024, v6e-256,
        tpu7x-256: xpk's names), on demand unless --spot or --reservation.
run     starts workload W: python -m vit_jax.main with the arguments after
        -- in every host of N slices at once. Without --docker-image xpk
        builds an image of this checkout on python:3.11 and each host
        installs vit_jax[tpu] first; with it, the image must hold vit_jax.
        With --max-restarts=K a failed or preempted workload starts again
        and resumes from the workdir's last checkpoint. Over several slices
        give --config.mesh.slices=N or leave it at -1.
stop    deletes workload W; the cluster and the gs:// workdir stay.
delete  deletes cluster C, which stops its billing.
--dry-run prints the xpk command instead of running it."

ACTION=""
CLUSTER=""
TPU_TYPE=""
NUM_SLICES=1
WORKLOAD=""
DOCKER_IMAGE=""
MAX_RESTARTS=""
CAPACITY=(--on-demand)
while (( $# )); do
  arg=$1
  shift
  [[ "$arg" == -- ]] && break
  case "$arg" in
    --name | --name=*) usage_error "unknown flag ${arg%%=*} (a cluster is --cluster)" ;;
    create | run | stop | delete)
      [[ -z "$ACTION" ]] || usage_error "two actions: $ACTION and $arg"
      ACTION=$arg
      continue ;;
    -*) ;;
    *) usage_error "unknown action $arg: create, run, stop or delete" ;;
  esac
  parse_common_flag "$arg" && continue
  case "$arg" in
    --cluster=*) CLUSTER=${arg#*=} ;;
    --tpu-type=*) TPU_TYPE=${arg#*=} ;;
    --num-slices=*) NUM_SLICES=${arg#*=} ;;
    --workload=*) WORKLOAD=${arg#*=} ;;
    --docker-image=*) DOCKER_IMAGE=${arg#*=} ;;
    --max-restarts=*) MAX_RESTARTS=${arg#*=} ;;
    --spot | --reservation=*)
      [[ "${CAPACITY[0]}" == --on-demand ]] ||
        usage_error "${CAPACITY[0]%%=*} and ${arg%%=*} exclude each other"
      if [[ "$arg" == --spot ]]; then CAPACITY=(--spot)
      else CAPACITY=(--reservation="${arg#*=}"); fi ;;
    --cluster | --tpu-type | --num-slices | --workload | --docker-image | \
      --max-restarts | --reservation)
      usage_error "$arg takes a value: $arg=VALUE" ;;
    *) usage_error "unknown flag $arg" ;;
  esac
done
MAIN_ARGS=("$@")

[[ -n "$ACTION" ]] || usage_error "missing the action: create, run, stop or delete"
require_flag CLUSTER --cluster
require_flag ZONE --zone
LOCATION=(--cluster="$CLUSTER" --zone="$ZONE")
if [[ -n "$PROJECT" ]]; then
  LOCATION+=(--project="$PROJECT")
fi
if [[ "$ACTION" == create || "$ACTION" == run ]]; then
  require_flag TPU_TYPE --tpu-type
  # The generations xpk runs on GKE, named as Cloud TPU names them; xpk
  # itself refuses a size its catalogue lacks.
  [[ "$TPU_TYPE" =~ ^(v4|v5p|v5litepod|v6e|tpu7x)-[1-9][0-9]{0,4}$ ]] ||
    usage_error "invalid TPU type $TPU_TYPE; such as v5p-1024, v6e-256, tpu7x-256"
  [[ "$NUM_SLICES" =~ ^[1-9][0-9]{0,3}$ ]] ||
    usage_error "--num-slices=$NUM_SLICES: give a whole number from 1"
fi
# As xpk checks it, after the cluster is up: a lowercase letter, then
# lowercase letters, digits and dashes, not ending in a dash; 40 at most.
[[ -z "$WORKLOAD" || ( "$WORKLOAD" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ &&
                       ${#WORKLOAD} -le 40 ) ]] ||
  usage_error "--workload=$WORKLOAD: a lowercase letter, then lowercase letters, digits or dashes, not ending in a dash; 40 characters at most"
[[ -z "$MAX_RESTARTS" || "$MAX_RESTARTS" =~ ^(0|[1-9][0-9]{0,2})$ ]] ||
  usage_error "--max-restarts=$MAX_RESTARTS: give a whole number"
if [[ "$ACTION" != run && ${#MAIN_ARGS[@]} -gt 0 ]]; then
  usage_error "only run takes vit_jax.main's arguments after --"
fi

case "$ACTION" in
  create)
    run_cmd xpk cluster create "${LOCATION[@]}" --tpu-type="$TPU_TYPE" \
      --num-slices="$NUM_SLICES" "${CAPACITY[@]}"
    ;;
  stop)
    require_flag WORKLOAD --workload
    run_cmd xpk workload delete "${LOCATION[@]}" --workload="$WORKLOAD"
    ;;
  delete)
    run_cmd xpk cluster delete "${LOCATION[@]}"
    ;;
  run)
    require_flag WORKLOAD --workload
    WORKDIR=$(workdir_of "${MAIN_ARGS[@]}")
    [[ -n "$WORKDIR" ]] || usage_error "missing --workdir=DIR after --"
    # A container's disk is gone when it stops, and every host writes its
    # part of each checkpoint: only a bucket holds a run.
    [[ "$WORKDIR" == gs://* ]] ||
      usage_error "--workdir=$WORKDIR: on GKE the workdir must be a gs:// path"
    main="python -m vit_jax.main $(shell_join "${MAIN_ARGS[@]}")"
    cmd=(xpk workload create "${LOCATION[@]}" --workload="$WORKLOAD"
      --tpu-type="$TPU_TYPE" --num-slices="$NUM_SLICES")
    if [[ -n "$DOCKER_IMAGE" ]]; then
      cmd+=(--docker-image="$DOCKER_IMAGE" --command="$main")
    else
      # xpk copies --script-dir into its image's working directory
      # (less what .dockerignore names: the venv, workdirs, .git).
      cmd+=(--base-docker-image=python:3.11
        --script-dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
        --command="python -m pip install -q '.[tpu]' && $main")
    fi
    if [[ -n "$MAX_RESTARTS" ]]; then
      cmd+=(--max-restarts="$MAX_RESTARTS")
    fi
    run_cmd "${cmd[@]}"
    ;;
esac
