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
# The interpreter is $PYTHON if set, else the checkout's .venv/bin/python if
# it is executable, else python3 from PATH.
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

cd "$(dirname "$0")/.."
if [[ -n ${PYTHON:-} ]]; then
  python=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  python=$PWD/.venv/bin/python
else
  python=python3
fi
# The coordinator's port: one that nothing here listens on (bash connects
# through /dev/tcp; a refused connection leaves the port free), below Linux's
# ephemeral range, where outgoing connections take theirs.
port=""
for _ in {1..100}; do
  candidate=$((20000 + RANDOM % 12000))
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
    port=$candidate
    break
  fi
done
if [[ -z $port ]]; then
  echo "error: no free port for the coordinator in 20000-31999" >&2
  exit 1
fi
# Keep the caller's other XLA flags; the device count is this script's.
xla_flags="$(echo "${XLA_FLAGS:-}" | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g') --xla_force_host_platform_device_count=$devices"

# The trap comes first: a signal that arrived while the processes started
# would otherwise end this script and leave them running. One that arrives
# before all have started is passed on once they have.
pids=()
told=0
forward() {
  told=1
  ((${#pids[@]} == 0)) || kill -TERM "${pids[@]}" 2>/dev/null || true
}
trap forward TERM INT
for ((i = 0; i < num_processes; i++)); do
  XLA_FLAGS=$xla_flags JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1 \
    "$python" -m vit_jax.main "$@" --coordinator_address="127.0.0.1:$port" \
    --num_processes="$num_processes" --process_id="$i" \
    > >(sed -u "s/^/[$i] /") 2>&1 &
  pids+=("$!")
done
((told == 0)) || forward

stop_others() {
  # A process whose peer died would wait in a collective until a timeout.
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 3
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

status=0
running=("${pids[@]}")

# Process $1 has exited with code $2: it is no longer waited for, and if it
# is the first to fail, its code becomes the pod's and the others are stopped.
ended() {
  local pid=$1 code=$2 p i still=()
  for p in "${running[@]}"; do
    [[ $p == "$pid" ]] || still+=("$p")
  done
  running=("${still[@]}")
  if ((code != 0 && status == 0)); then
    status=$code
    for i in "${!pids[@]}"; do
      [[ ${pids[i]} == "$pid" ]] && break
    done
    echo "[pod] process $i (pid $pid) exited with code $code;" \
      "stopping the others" >&2
    stop_others
  fi
}

while ((${#running[@]} > 0)); do
  finished=""
  # Quiet: it names processes that bash has already reaped ("no such job").
  if wait -n -p finished "${running[@]}" 2>/dev/null; then
    code=0
  else
    code=$?
  fi
  if [[ -n ${finished:-} ]]; then  # wait -n unsets it before it reports.
    ended "$finished" "$code"
    continue
  fi
  # wait -n named no process: a trapped signal interrupted it, or the
  # processes had already been reaped. Collect those that have exited; bash
  # keeps the codes of reaped background processes for `wait PID`.
  collected=0
  for pid in "${running[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    if wait "$pid"; then code=0; else code=$?; fi
    ended "$pid" "$code"
    collected=1
  done
  ((collected)) || sleep 0.1  # Nothing has exited yet: wait again, not spin.
done
wait 2>/dev/null || true  # Let the prefixing pipes drain.
exit "$status"
