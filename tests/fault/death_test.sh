#!/usr/bin/env bash
# A rank dies (SIGKILL) or stops (SIGSTOP) in the middle of a loop of collectives: every
# other rank must raise within seconds (asserted <= 10 s after the death, against an op
# timeout of 60 s; the goal is <= 5 s), naming the failed rank, the op and its sequence
# number; lockstep-run must name the failed rank first and print the error file of a rank
# that raised; nothing may hang at exit or stay behind in /dev/shm. A rank that leaves after
# an error of its own (returns 1 from main, its process alive in MPI_Finalize under mpi)
# ends the job the same way, within 5 s.
# usage: death_test.sh FAULT_PROGRAM LOCKSTEP_RUN BACKEND [MPIRUN_SH]
#   BACKEND: shm | gloo | gloo-remote (gloo with same-machine pid watching off, so the
#   heartbeats and the store notice, the cross-node path, must find the rank) | mpi (under
#   mpirun: MPIRUN_SH is scripts/mpirun.sh; lockstep-run cannot start an MPI job) |
#   mpirun-shm (under mpirun with no LOCKSTEP_BACKEND: shm, its store bootstrapped by MPI)
set -u
prog=$1; run=$2; kind=$3; mpirun_sh=${4:-}
bound=10
export LOCKSTEP_TIMEOUT_S=60 MASTER_ADDR=127.0.0.1
backend=$kind
[[ $kind == gloo-remote ]] && { backend=gloo; export LOCKSTEP_LIVENESS_LOCAL=0; }
export LOCKSTEP_BACKEND=$backend
[[ $kind == mpirun-shm ]] && { backend=shm; unset LOCKSTEP_BACKEND MASTER_ADDR; }
mpirun=0; [[ $kind == mpi || $kind == mpirun-shm ]] && mpirun=1
tmp=$(mktemp -d); trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/checks.sh
source "$here/../lib/checks.sh"
# shellcheck source=../lib/survivors.sh
source "$here/../lib/survivors.sh"
tally_tag="[$kind]"
on_fail() {  # shows the job's output, once per case, so a rare failure can be read
  if [[ -n ${out:-} && -f $out && ${shown:-} != "$out" ]]; then
    sed 's/^/    | /' "$out" | tail -40; shown=$out
  fi
}
shm_list() { ls /dev/shm 2>/dev/null | grep -E '^(lockstep-|vader_segment)' | sort; }
shm_before=$(shm_list)

# case NAME VICTIM SIGNAL OP: one job; sets $out (all output) and $after (exit - death, s).
case_run() {
  local name=$1 victim=$2 sig=$3 op=$4
  out=$tmp/$name.out
  rm -f "$tmp/death"
  local args=(die-in-loop --victim "$victim" --signal "$sig" --op "$op" --at 5
              --death-file "$tmp/death")
  if [[ $mpirun == 1 ]]; then
    timeout 60 "$mpirun_sh" -np 3 "$prog" "${args[@]}" >"$out" 2>&1
  else
    # --notice-seconds: long enough for the heartbeats (gloo-remote), which a real remote
    # node's ranks have all the time they need for, since no launcher of theirs saw a death.
    timeout 60 "$run" --nproc-per-node 3 --master-port 0 --grace-seconds 2 --notice-seconds 6 \
      "$prog" "${args[@]}" >"$out" 2>&1
  fi
  rc=$?
  local end; end=$(now)
  after=$(echo "$end - $(cat "$tmp/death" 2>/dev/null || echo 0)" | bc)
  [[ $rc -eq 124 ]] && fail "$name: the job hung (killed by timeout after 60 s)"
}

# check_survivors NAME VICTIM OPNAME: every rank but VICTIM raised naming it, the op and #6
# within $bound s; the job ended within $bound + 3 s.
check_survivors() {
  local name=$1 victim=$2 opname=$3
  survivors_raised "$name" "$out" "$victim" "$opname #6" "$bound" 0 1 2
  if le "$after" $((bound + 3)); then pass "$name: the job ended ${after} s after the death"
  else fail "$name: the job ended only ${after} s after the death"; fi
}

check_launcher_names() {  # NAME VICTIM: lockstep-run's summary blames the victim first
  local name=$1 victim=$2
  if grep -q "lockstep-run: rank $victim (local rank $victim, pid [0-9]*) failed first: killed by signal 9 (SIGKILL)" "$out"; then
    pass "$name: lockstep-run names rank $victim as the first failure"
  else
    fail "$name: summary: $(grep 'failed first' "$out")"
  fi
  if grep -q "        error: rank [0-9]/3 \[$backend\]" "$out"; then
    pass "$name: the survivors' error files are listed"
  else
    fail "$name: no survivor's error file in the summary"
  fi
}

# mpirun_kill NAME VICTIM OP OPNAME: mpirun kills the job when it sees a rank die: the
# survivors' own message races it, and mpirun's "process rank V ... exited on signal 9"
# names the rank either way.
mpirun_kill() {
  local name=$1 victim=$2 op=$3 opname=$4
  case_run "$name" "$victim" KILL "$op"
  if grep -q "caught CommError" "$out"; then check_survivors "$name" "$victim" "$opname"
  elif grep -q "process rank $victim .*exited on signal 9" "$out" && le "$after" $((bound + 3)); then
    pass "$name: mpirun ended the job ${after} s after the death, naming rank $victim"
  else fail "$name: $(tail -5 "$out")"; fi
}

# leave: rank 1 raises an error no other rank sees and returns 1 from main, mid-loop.
case_run leave 1 RETURN allreduce
if [[ $kind == gloo-remote ]]; then
  # Across nodes (no pid watch) the survivors see gloo's "Connection closed by peer
  # [address]" when the rank's process ends, which names an address, not a rank; the
  # launcher's summary names it.
  for r in 0 2; do
    s=$(grep -m1 "rank $r caught CommError" "$out" | sed -E 's/.* ([0-9.]+) s after the death.*/\1/')
    if [[ -n $s ]] && le "$s" 5; then pass "leave: rank $r raised $s s after rank 1 left"
    else fail "leave: rank $r raised no CommError within 5 s"; fi
  done
  if grep -q "lockstep-run: rank 1 (local rank 1, pid [0-9]*) failed first: exited with code 1" "$out"; then
    pass "leave: lockstep-run names rank 1 as the first failure"
  else fail "leave: summary: $(grep 'failed first' "$out")"; fi
else
  bound=5 check_survivors leave 1 allreduce
fi

if [[ $kind == mpi ]]; then
  if grep -q "rank 1 left the job: it reached MPI_Finalize (exit status 1" "$out"; then
    pass "leave: the survivors' error says rank 1 left the job from MPI_Finalize"
  else fail "leave: $(grep -m1 'caught CommError' "$out")"; fi
  mpirun_kill kill-allreduce 2 allreduce allreduce
  case_run stop-barrier 1 STOP barrier
  check_survivors stop-barrier 1 barrier
  if grep -q "MPI_Abort(MPI_COMM_WORLD, 3) instead of MPI_Finalize" "$out"; then
    pass "stop-barrier: the broken job ended with MPI_Abort, not a blocking MPI_Finalize"
  else fail "stop-barrier: no MPI_Abort: $(tail -3 "$out")"; fi
elif [[ $kind == mpirun-shm ]]; then
  # shm's own failure detection, as under lockstep-run; MPI only carried the store's
  # address and must not hang the exit.
  mpirun_kill kill-allreduce 2 allreduce allreduce
  if grep -q "rank [0-9]/3 \[shm\]" "$out" || ! grep -q "caught CommError" "$out"; then
    pass "kill-allreduce: the group was shm"
  else fail "kill-allreduce: the group was not shm: $(grep -m1 'caught CommError' "$out")"; fi
  mpirun_kill kill-barrier 1 mixed barrier
  # Stopped: nobody dies, so mpirun does nothing; the survivors raise (shm reads the
  # stopped state) and exit 3, and must end the job with MPI_Abort rather than wait in
  # MPI_Finalize for the stopped rank.
  case_run stop 2 STOP mixed
  bound=5 check_survivors stop 2 barrier
  if grep -q "MPI_Abort(MPI_COMM_WORLD, 3) instead of MPI_Finalize" "$out"; then
    pass "stop: the job ended with MPI_Abort, not a blocking MPI_Finalize"
  else fail "stop: no MPI_Abort: $(tail -3 "$out")"; fi
else
  case_run kill-allreduce 2 KILL allreduce
  check_survivors kill-allreduce 2 allreduce
  check_launcher_names kill-allreduce 2
  case_run kill-barrier 1 KILL mixed
  check_survivors kill-barrier 1 barrier
  check_launcher_names kill-barrier 1
  if [[ $backend == shm ]]; then
    # Stopped, not dead: the waits' liveness checks read its state in /proc and give up
    # on it after 3 s stopped (WaitPolicy::stop_limit): asserted within 5 s here.
    case_run stop 2 STOP mixed
    bound=5 check_survivors stop 2 barrier
    if grep -q "rank 2 (pid [0-9]*, this host) is stopped (SIGSTOP/SIGTSTP)" "$out"; then
      pass "stop: the error says rank 2 is stopped"
    else fail "stop: no 'rank 2 ... is stopped' in the output"; fi
  fi
  if [[ $backend == gloo ]]; then
    case_run kill-store-host 0 KILL allreduce  # rank 0 hosts the rendezvous store
    check_survivors kill-store-host 0 allreduce
    check_launcher_names kill-store-host 0
    case_run stop-store-host 0 STOP allreduce  # its store stops answering too
    check_survivors stop-store-host 0 allreduce
    case_run stop 2 STOP mixed  # stopped: only the heartbeats (or the pid's state) show it
    check_survivors stop 2 barrier
    if grep -q "failed first: exited with code 3" "$out" &&
      grep -q "lockstep-run: error reported by rank [01]:" "$out" &&
      grep -q "^    rank [01]/3 \[gloo\] barrier #6 peer rank 2 " "$out" &&
      grep -q "note: rank 2 was stopped by SIGSTOP" "$out"; then
      pass "stop: the summary prints the first failure's error file, naming rank 2, and notes the stop"
    else
      fail "stop: summary: $(grep -A4 'failed first' "$out")"
    fi
  fi
fi

sleep 0.5  # mpirun's cleanup of its session directory may lag its exit a little
leftover=$(comm -13 <(echo "$shm_before") <(shm_list))
if [[ -z $leftover ]]; then pass "no shared-memory segment left in /dev/shm"
else fail "/dev/shm leftovers: $leftover"; fi

finish
