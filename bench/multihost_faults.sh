#!/usr/bin/env bash
# Fault-tolerance soak across hosts: HOSTS "hosts" (network namespaces,
# tests/multihost/netns.sh) x NPROC replicas, one `lockstep-run --fault-tolerant --nnodes
# HOSTS` per host running lockstep-bench faults' fault-tolerant worker (gloo between
# hosts), run twice: without faults, then while a fault strikes every [0.5, 1.5] x EVERY
# seconds: a host cut off the network for CUT_S seconds (share CUTS), a replica SIGSTOPped
# for STOP_S seconds (share STOPS), or a replica SIGKILLed. Only replicas that are
# committing are struck, and only while replicas on another host commit too (losing every
# holder of the state is a loss no replica scheme survives). `lockstep-bench faults
# --analyze` then reports faults, steps committed against attempted, efficiency against its
# bound, heals, hangs and errors (docs/benchmarks.md). Needs root (ip netns).
#
# usage: bench/multihost_faults.sh [BUILD_DIR]
# env:   HOSTS=3 NPROC=2 STEPS=3000 STEP_MS=20 EVERY=2 CUTS=0.2 STOPS=0.2 CUT_S=6 STOP_S=5
#        TIMEOUT=900 SEED=1
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
bench=$build/bench/lockstep-bench
run=$build/apps/lockstep-run
HOSTS=${HOSTS:-3} NPROC=${NPROC:-2} STEPS=${STEPS:-3000} STEP_MS=${STEP_MS:-20} EVERY=${EVERY:-2}
CUTS=${CUTS:-0.2} STOPS=${STOPS:-0.2} CUT_S=${CUT_S:-6} STOP_S=${STOP_S:-5}
TIMEOUT=${TIMEOUT:-900} SEED=${SEED:-1}
for f in "$bench" "$run"; do
  [[ -x $f ]] || { echo "bench/multihost_faults.sh: $f not built"; exit 2; }
done
# shellcheck source=../tests/multihost/netns.sh
source "$here/../tests/multihost/netns.sh"
mh_require
mh_setup "$HOSTS" || exit 1
replicas=$((HOSTS * NPROC))
RANDOM=$SEED
echo "$HOSTS hosts x $NPROC replicas (gloo between hosts), $STEPS steps of $STEP_MS ms," \
  "a fault every $EVERY s on average: ${CUTS} cuts of ${CUT_S} s, ${STOPS} stops of ${STOP_S} s," \
  "the rest kills; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_JOB_ID
now() { date +%s.%N; }
coin() { awk -v r=$RANDOM -v p="$1" 'BEGIN { exit !(r / 32768 < p) }'; }

# The root-namespace pid of replica ID's worker (on host HOST), or nothing.
worker_pid() {
  local pid
  for pid in $(ip netns pids "$(mh_ns "$1")"); do
    tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qx -- --worker || continue
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "LOCKSTEP_REPLICA_ID=$2" &&
      { echo "$pid"; return; }
  done
}
# Whether replica ID's last logged event is a commit less than a second old.
committing() {
  local last
  last=$(tail -n1 "$dir/log_$1" 2>/dev/null)
  [[ $last == *" commit "* ]] && awk -v t="${last%% *}" -v n="$(now)" 'BEGIN { exit !(n - t < 1) }'
}
host_of() { echo $(($1 / NPROC + 1)); }

# job DIR: one lockstep-run per host, in the background; DIR/status once all ended.
job() {
  dir=$1
  rm -rf "$dir" && mkdir -p "$dir"
  local i
  pids=()
  t0=$(now)
  for ((i = 1; i <= HOSTS; i++)); do
    mh_exec "$i" timeout -s KILL "$TIMEOUT" "$run" --fault-tolerant --nnodes "$HOSTS" \
      --node-rank $((i - 1)) --nproc-per-node "$NPROC" --master-addr "$(mh_ip 1)" \
      --master-port 29500 --max-restarts 100000 env LOCKSTEP_BACKEND=gloo "$bench" faults \
      --worker --mode ft --dir "$dir" --steps "$STEPS" --step-ms "$STEP_MS" >"$dir/host$i.out" 2>&1 &
    pids+=($!)
  done
}
finish_job() {
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  ((rc == 137)) && rc=124  # timeout -s KILL: past TIMEOUT, hung
  echo "$rc" > "$dir/status"
  awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }' > "$dir/wall"
}
running() { local p; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

echo "running no-faults ..."
job "$MH_DIR/clean"
finish_job
echo "running fault-tolerant ..."
job "$MH_DIR/ft"
: > "$dir/faults"
next=$(awk -v n="$(now)" -v e="$EVERY" -v r=$RANDOM 'BEGIN { printf "%.6f", n + e * (0.5 + r / 32768) }')
declare -A resume=()  # pid -> when to SIGCONT it
while running; do
  sleep 0.05
  for p in "${!resume[@]}"; do
    if awk -v t="${resume[$p]}" -v n="$(now)" 'BEGIN { exit !(n >= t) }'; then
      kill -CONT "$p" 2>/dev/null
      unset "resume[$p]"
    fi
  done
  awk -v t="$next" -v n="$(now)" 'BEGIN { exit !(n >= t) }' || continue
  live=()
  for ((r = 0; r < replicas; r++)) do committing "$r" && live+=("$r"); done
  ((${#live[@]} >= 2)) || continue
  victim=${live[$((RANDOM % ${#live[@]}))]}
  h=$(host_of "$victim")
  others=0
  for r in "${live[@]}"; do [[ $(host_of "$r") != "$h" ]] && others=1; done
  ((others)) || continue
  if coin "$CUTS"; then
    t=$(now)
    for ((r = (h - 1) * NPROC; r < h * NPROC; r++)); do echo "$t $r c" >> "$dir/faults"; done
    mh_link "$h" down
    sleep "$CUT_S"
    mh_link "$h" up
  else
    pid=$(worker_pid "$h" "$victim")
    [[ -n $pid ]] || continue
    if coin "$STOPS"; then
      kill -STOP "$pid" && echo "$(now) $victim s" >> "$dir/faults" &&
        resume[$pid]=$(awk -v n="$(now)" -v s="$STOP_S" 'BEGIN { printf "%.6f", n + s }')
    else
      kill -KILL "$pid" && echo "$(now) $victim k" >> "$dir/faults"
    fi
  fi
  next=$(awk -v n="$(now)" -v e="$EVERY" -v r=$RANDOM 'BEGIN { printf "%.6f", n + e * (0.5 + r / 32768) }')
done
for p in "${!resume[@]}"; do kill -CONT "$p" 2>/dev/null; done
finish_job
"$bench" faults --analyze "$MH_DIR/ft" --baseline "$MH_DIR/clean" \
  --replicas "$replicas" --steps "$STEPS" --timeout "$TIMEOUT"
rc=$?
if ((rc != 0)); then
  for ((i = 1; i <= HOSTS; i++)); do tail -5 "$dir/host$i.out" | sed "s/^/  host$i | /"; done
fi
exit $rc
