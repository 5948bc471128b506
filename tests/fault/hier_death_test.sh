#!/usr/bin/env bash
# The hier backend (shm inside each node, gloo across): a rank of a 2-node x 2-rank job
# dies (SIGKILL) or stops (SIGSTOP) in a loop of collectives; every rank of BOTH nodes must
# raise within seconds (asserted <= 10 s after the death; op timeout 60 s), naming the
# failed rank by its job rank, and each node's lockstep-run must exit non-zero. The two
# "nodes" are two lockstep-run --nnodes 2 on this host (tests/multiprocess/nodes.sh); on
# separate hosts: tests/multihost/.
# usage: hier_death_test.sh FAULT_PROGRAM LOCKSTEP_RUN
set -u
prog=$1; run=$2
bound=10
export LOCKSTEP_TIMEOUT_S=60 LOCKSTEP_BACKEND=hier
tmp=$(mktemp -d); trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/checks.sh
source "$here/../lib/checks.sh"
# shellcheck source=../lib/survivors.sh
source "$here/../lib/survivors.sh"
on_fail() { sed 's/^/    | /' "$out" | tail -30; }

# case_run NAME VICTIM SIGNAL OP: both nodes' launchers; sets $out and $rcs.
case_run() {
  local name=$1 victim=$2 sig=$3 op=$4 p i pids=()
  out=$tmp/$name.out; rcs=""
  rm -f "$tmp/death"
  p=$(free_port)
  for i in 0 1; do
    timeout 60 "$run" --nnodes 2 --node-rank $i --nproc-per-node 2 --master-addr 127.0.0.1 \
      --master-port "$p" --rdzv-id "hier-death-$$-$name" --grace-seconds 2 --notice-seconds 6 \
      "$prog" die-in-loop --victim "$victim" --signal "$sig" --op "$op" --at 5 \
      --death-file "$tmp/death" >"$out.$i" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}"; rcs+=" $?"; done
  cat "$out.0" "$out.1" >"$out"
}

# check_case NAME VICTIM OPNAME: every other rank raised naming the victim, the op and #6, in
# time; both launchers exited non-zero (and not by the test's timeout).
check_case() {
  local name=$1 victim=$2 opname=$3
  survivors_raised "$name" "$out" "$victim" "\[hier\] $opname #6" "$bound" 0 1 2 3
  if [[ $rcs =~ ^\ [1-9][0-9]*\ [1-9][0-9]*$ && ! $rcs =~ 124 ]]; then
    pass "$name: both nodes' lockstep-run exited non-zero ($rcs)"
  else
    fail "$name: launcher exit statuses:$rcs"
  fi
}

case_run kill-allreduce 3 KILL allreduce  # node 1's second rank
check_case kill-allreduce 3 allreduce
case_run kill-barrier 1 KILL mixed  # node 0's second rank, while others are in a barrier
check_case kill-barrier 1 barrier
case_run stop-allreduce 2 STOP allreduce  # node 1's first rank: only its state shows it
check_case stop-allreduce 2 allreduce

finish
