#!/usr/bin/env bash
# A pod of NUM_PROCESSES processes on this machine, each with
# DEVICES_PER_PROCESS emulated CPU devices, joined by jax.distributed over
# loopback: the same program a TPU pod runs, one process per host.
#
#   launch/local_pod.sh NUM_PROCESSES DEVICES_PER_PROCESS -- <vit_jax.main arguments>
#
# Output lines carry a "[process]" prefix. If a process fails, the others are
# stopped and the pod exits with its code. SIGTERM or SIGINT to the pod is
# passed to every process (they then save and stop at one agreed step).
# PYTHON names the interpreter (default: python3).
set -euo pipefail

usage() {
  echo "usage: $0 NUM_PROCESSES DEVICES_PER_PROCESS -- <vit_jax.main arguments>" >&2
  exit 2
}
[[ $# -ge 3 && $3 == "--" ]] || usage
num_processes=$1
devices=$2
shift 3
[[ $num_processes =~ ^[1-9][0-9]*$ && $devices =~ ^[1-9][0-9]*$ ]] || usage

python=${PYTHON:-python3}
cd "$(dirname "$0")/.."
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# Keep the caller's other XLA flags; the device count is this script's.
xla_flags="$(echo "${XLA_FLAGS:-}" | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g') --xla_force_host_platform_device_count=$devices"

pids=()
for ((i = 0; i < num_processes; i++)); do
  XLA_FLAGS=$xla_flags JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1 \
    "$python" -m vit_jax.main "$@" --coordinator_address="127.0.0.1:$port" \
    --num_processes="$num_processes" --process_id="$i" \
    > >(sed "s/^/[$i] /") 2>&1 &
  pids+=("$!")
done

forward() { kill -TERM "${pids[@]}" 2>/dev/null || true; }
trap forward TERM INT

stop_others() {
  # A process whose peer died would wait in a collective until a timeout.
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 3
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

status=0
running=("${pids[@]}")
while ((${#running[@]} > 0)); do
  finished=""
  if wait -n -p finished "${running[@]}"; then code=0; else code=$?; fi
  [[ -n $finished ]] || continue  # A trapped signal interrupted the wait.
  running=($(printf '%s\n' "${running[@]}" | grep -vx "$finished" || true))
  if ((code != 0 && status == 0)); then
    status=$code
    echo "[pod] process $finished exited with code $code; stopping the others" >&2
    stop_others
  fi
done
wait 2>/dev/null || true  # Let the prefixing pipes drain.
exit "$status"
