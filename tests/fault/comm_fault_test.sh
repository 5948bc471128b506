#!/usr/bin/env bash
# Fault tests of the communication layer, with real processes:
#  1. a rank SIGKILLed in the middle of a collective: the others raise CommError within
#     twice the timeout, and no shared-memory segment is left behind;
#  2. the same under lockstep-run: it exits non-zero naming the rank and the signal;
#  3. a rank that never joins: the others fail at rendezvous naming the missing rank;
#  4. a MASTER_PORT already in use: rank 0 says so and how to fix it.
# usage: comm_fault_test.sh FAULT_PROGRAM LOCKSTEP_RUN BACKEND
set -u
prog=$1; run=$2; backend=$3
timeout_s=4
export LOCKSTEP_BACKEND=$backend LOCKSTEP_TIMEOUT_S=$timeout_s MASTER_ADDR=127.0.0.1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../lib/checks.sh"
tally_tag="[$backend]"
shm_count() { ls /dev/shm 2>/dev/null | grep -c '^lockstep-' ; }
shm_before=$(shm_count)

# 1. Survivors raise CommError within 2x the timeout.
export MASTER_PORT=$(free_port) WORLD_SIZE=3 LOCAL_WORLD_SIZE=3
start=$(date +%s.%N)
for r in 0 1 2; do
  RANK=$r LOCAL_RANK=$r "$prog" kill-mid-collective 2>"$tmp/err$r" &
  pids[$r]=$!
done
for r in 0 1 2; do wait "${pids[$r]}"; codes[$r]=$?; done
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
for r in 0 1; do
  if [[ ${codes[$r]} -eq 3 ]] && grep -q "caught CommError" "$tmp/err$r"; then
    pass "rank $r raised: $(grep -o 'caught CommError.*' "$tmp/err$r" | cut -c1-220)"
  else
    fail "rank $r exited ${codes[$r]} without CommError: $(cat "$tmp/err$r")"
  fi
done
if (( $(echo "$elapsed < 2 * $timeout_s + 3" | bc) )); then  # + start-up of 3 processes
  pass "survivors finished in ${elapsed}s (timeout ${timeout_s}s)"
else
  fail "survivors took ${elapsed}s, more than twice the ${timeout_s}s timeout"
fi
[[ ${codes[2]} -eq 137 ]] && pass "victim died by SIGKILL" || fail "victim exit ${codes[2]}"
if [[ $(shm_count) -le $shm_before ]]; then pass "no shared-memory segment left"
else fail "/dev/shm has leftovers: $(ls /dev/shm | grep '^lockstep-')"; fi
unset WORLD_SIZE LOCAL_WORLD_SIZE MASTER_PORT

# 2. Under lockstep-run: non-zero exit naming the rank and the signal.
"$run" --nproc-per-node 3 --master-port 0 --grace-seconds 2 "$prog" kill-mid-collective \
  >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 0 ]] && grep -q "rank 2" "$tmp/err" && grep -qi "signal 9\|SIGKILL" "$tmp/err"; then
  pass "lockstep-run exited $code naming rank 2 and SIGKILL"
else
  fail "lockstep-run exit $code; stderr: $(tail -5 "$tmp/err")"
fi

# 3. A rank that never joins.
export MASTER_PORT=$(free_port) WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 LOCKSTEP_TIMEOUT_S=3
for r in 0 1; do RANK=$r LOCAL_RANK=$r "$prog" join 2>"$tmp/join$r" & pids[$r]=$!; done
for r in 0 1; do
  wait "${pids[$r]}"; c=$?
  if [[ $c -ne 0 ]] && grep -q "missing rank(s) 2" "$tmp/join$r"; then
    pass "rank $r: $(grep -o 'rendezvous.*' "$tmp/join$r" | head -1 | cut -c1-160)"
  else
    fail "rank $r exit $c: $(cat "$tmp/join$r")"
  fi
done

# 4. MASTER_PORT in use: a second rank 0 on the same port.
export MASTER_PORT=$(free_port) WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 LOCKSTEP_TIMEOUT_S=5
RANK=0 LOCAL_RANK=0 "$prog" join >/dev/null 2>&1 & holder=$!
sleep 1
RANK=0 LOCAL_RANK=0 "$prog" join 2>"$tmp/port"; c=$?
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
if [[ $c -ne 0 ]] && grep -q "port is in use" "$tmp/port"; then
  pass "port in use: $(cut -c1-200 "$tmp/port")"
else
  fail "second rank 0 exit $c: $(cat "$tmp/port")"
fi

finish
