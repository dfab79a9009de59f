#!/usr/bin/env bash
# Shared by the tpu_*.sh scripts and gke.sh, which source it; not a command on its own.
#
# Each script sets USAGE, then loops over its arguments, giving each to
# parse_common_flag first and handling only its own flags itself.

set -euo pipefail

PROG=$(basename "$0")
NAME=""
ZONE=""
PROJECT=""
DRY_RUN=0

# Where the code and its virtualenv live on every worker; the ~ is left for
# the worker's shell to expand. The venv sits outside the code so that
# reinstalling new code keeps its packages.
REMOTE_DIR='~/vit_jax'
REMOTE_VENV='~/vit_jax_venv'
REMOTE_LOG='~/vit_jax_run.log'

# Bad usage: one line naming the problem, exit 2 (as getopt-style tools do).
usage_error() {
  echo "$PROG: $*; see $PROG --help" >&2
  exit 2
}

die() {
  echo "$PROG: $*" >&2
  exit 1
}

# Returns 1 for a flag it does not know, so the caller can try its own.
parse_common_flag() {
  case "$1" in
    --name=*) NAME=${1#*=} ;;
    --zone=*) ZONE=${1#*=} ;;
    --project=*) PROJECT=${1#*=} ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) echo "$USAGE"; exit 0 ;;
    # The space-separated form would silently take the next flag as a value.
    --name | --zone | --project) usage_error "$1 takes a value: $1=VALUE" ;;
    *) return 1 ;;
  esac
}

# require_flag VAR --flag: fails when the flag was not given (or left empty).
require_flag() {
  [[ -n "${!1}" ]] || usage_error "missing required flag $2"
}

require_name_and_zone() {
  require_flag NAME --name
  require_flag ZONE --zone
}

# --zone and, when given, --project: every gcloud command here takes them.
location_flags() {
  LOCATION=(--zone="$ZONE")
  if [[ -n "$PROJECT" ]]; then
    LOCATION+=(--project="$PROJECT")
  fi
}

# The --workdir among vit_jax.main's arguments, the last as absl takes it
# (--workdir=DIR or --workdir DIR), or nothing.
workdir_of() {
  local args=("$@") i workdir=""
  for (( i = 0; i < ${#args[@]}; i++ )); do
    case "${args[i]}" in
      --workdir=*) workdir=${args[i]#*=} ;;
      --workdir) workdir=${args[i + 1]:-} ;;
    esac
  done
  printf '%s' "$workdir"
}

# Quotes one word for a POSIX shell: left bare when it is made of characters
# no shell treats specially, so printed commands stay readable; otherwise in
# single quotes. Both forms paste back into bash and parse with shlex.split.
shell_quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Quotes every argument and joins them with spaces.
shell_join() {
  local out="" word
  for word in "$@"; do
    out+="${out:+ }$(shell_quote "$word")"
  done
  printf '%s' "$out"
}

# Runs a command, or with --dry-run prints it as one copy-pasteable line.
run_cmd() {
  if (( DRY_RUN )); then
    shell_join "$@"
    echo
    return 0
  fi
  if [[ "$1" == gcloud ]] && ! command -v gcloud > /dev/null; then
    die "gcloud not found on PATH; install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), or use --dry-run to see the commands"
  fi
  if [[ "$1" == xpk ]] && ! command -v xpk > /dev/null; then
    die "xpk not found on PATH; pip install xpk (it drives gcloud and kubectl), or use --dry-run to see the commands"
  fi
  "$@"
}

# ssh to every worker of the slice at once and run a shell command there.
ssh_all() {
  run_cmd gcloud compute tpus tpu-vm ssh "$NAME" --worker=all "${LOCATION[@]}" \
    --command="$1"
}
