#!/usr/bin/env bash
# A real Slurm (Debian's slurmctld, slurmd, srun; auth/none, cred/none, no munge), started
# and stopped here: one slurmctld and 2 slurmd nodes on loopback (slurmd -N, each its own
# port). Then (docs/schedulers.md):
#  1. srun -N2 --ntasks-per-node=2 collectives_check: one job of 4 ranks, a task per rank;
#  2. srun -N2 --ntasks-per-node=1 lockstep-run --nproc-per-node 2 collectives_check: one
#     job of 4 ranks, lockstep-run reading the step (the issue's two-jobs bug);
#  3. srun -N2 --ntasks-per-node=2 --kill-on-bad-exit=1: a task SIGKILLed in a loop of
#     collectives; the others raise naming it and the step ends within 5 s of the death;
#  4. sbatch examples/slurm/train.sbatch (fault_program join), LAUNCH=per-node and per-rank:
#     ranks 0..3 each join once.
# The first node is named after this host so that the first host of the node list, the
# master address, resolves; the second "$me-2" (both at 127.0.0.1).
# Skips (exit 77) with the reason where the daemons are missing or cannot start.
# usage: slurm_test.sh COLLECTIVES_CHECK FAULT_PROGRAM LOCKSTEP_RUN        (about 40 s)
set -u
check=$1; prog=$2; run=$3
skip() { echo "SKIP: $* (the real-Slurm test needs root and Debian's slurmctld, slurmd, slurm-client)"; exit 77; }
[[ $(id -u) == 0 ]] || skip "not root"
for t in slurmctld slurmd srun sbatch sinfo; do command -v $t >/dev/null || skip "'$t' is not installed"; done
plugins=$(dirname "$(find /usr/lib -name auth_none.so -path '*slurm*' 2>/dev/null | head -1)")
[[ -f $plugins/auth_none.so && -f $plugins/cred_none.so ]] || skip "no auth/none, cred/none plugins"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-slurm.XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
failures=0; passes=0
case_start=$SECONDS
pass() { echo "PASS $* ($((SECONDS - case_start)) s)"; passes=$((passes + 1)); case_start=$SECONDS; }
fail() {
  echo "FAIL $* ($((SECONDS - case_start)) s)"; failures=$((failures + 1)); case_start=$SECONDS
  sed 's/^/    | /' "$out" | grep -v '\] \[c10d\] The IPv6 network addresses' | tail -30
}
has() { grep -qF -- "$2" "$1"; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The first node is this host's name (it resolves; Slurm reserves "localhost"), the second
# that name with "-2", which sorts after it: Slurm orders its nodes by name, task 0 runs on
# the first, and the master address is the first host of the step's node list, which must
# resolve (a second node "node2" sorted first and did not).
me=$(hostname)
getent hosts "$me" >/dev/null || skip "this host's name '$me' does not resolve"
mkdir -p "$tmp/state" "$tmp/spool"
cat >"$tmp/slurm.conf" <<EOF
ClusterName=lockstep$$
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$(port)
SlurmdPort=$(port)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
PlugStackConfig=/dev/null
NodeName=$me NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(port) CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000
NodeName=$me-2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(port) CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000
PartitionName=test Nodes=$me,$me-2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -c -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
pids+=($!); disown $!
sleep 1
for node in $me $me-2; do
  slurmd -D -N $node -f "$SLURM_CONF" >"$tmp/slurmd-$node.out" 2>&1 &
  pids+=($!); disown $!
done
for _ in $(seq 40); do
  [[ $(timeout 3 sinfo -h -o '%t' 2>/dev/null | sort -u) == idle ]] && [[ $(timeout 3 sinfo -h -o '%D') == 2 ]] && break
  sleep 0.5
done
if [[ $(timeout 3 sinfo -h -o '%t' 2>/dev/null | sort -u) != idle ]]; then
  cat "$tmp"/*.out "$tmp"/*.log 2>/dev/null | tail -20
  skip "the daemons did not bring 2 nodes up (sinfo: $(timeout 3 sinfo -h 2>&1 | tr '\n' ' '))"
fi
echo "slurm: 2 nodes up ($(timeout 3 sinfo -h -o '%N %t')) after $SECONDS s"
case_start=$SECONDS
# Nothing of the caller's launcher may leak into the tasks.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_LAUNCHER \
  LOCKSTEP_JOB_ID GROUP_RANK GROUP_WORLD_SIZE
# Two "nodes" on one host: gloo between them (hier would see one host name twice).
export LOCKSTEP_BACKEND=gloo LOCKSTEP_TIMEOUT_S=60

# 1. A task per rank.
out=$tmp/1.out
timeout 120 srun -N2 --ntasks-per-node=2 --kill-on-bad-exit=1 "$check" >"$out" 2>&1
rc=$?
if [[ $rc == 0 ]] && [[ $(grep -c 'rank [0-3]/4 \[gloo\]: [0-9]* passed, 0 failed' "$out") == 4 ]] &&
  has "$out" "lockstep: launched by Slurm (SLURM_PROCID=0" &&
  has "$out" "rank 0 of 4, local rank 0 of 2, master $me:"; then
  pass "srun -N2 --ntasks-per-node=2 collectives_check: one job of 4 ranks"
else
  fail "srun -N2 --ntasks-per-node=2 collectives_check (rc $rc)"
fi

# 2. lockstep-run per node.
out=$tmp/2.out
timeout 120 srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 \
  "$run" --nproc-per-node 2 --grace-seconds 2 "$check" >"$out" 2>&1
rc=$?
if [[ $rc == 0 ]] && [[ $(grep -c 'rank [0-3]/4 \[gloo\]: [0-9]* passed, 0 failed' "$out") == 4 ]] &&
  has "$out" "lockstep-run: Slurm (" && has "$out" "node 0 of 2" && has "$out" "node 1 of 2"; then
  pass "srun -N2 --ntasks-per-node=1 lockstep-run --nproc-per-node 2: one job of 4 ranks"
else
  fail "srun -N2 --ntasks-per-node=1 lockstep-run --nproc-per-node 2 (rc $rc)"
fi

# 3. A task killed mid-step: the step ends within 5 s of the death, the others name it.
out=$tmp/3.out
rm -f "$tmp/death"
timeout 120 srun -N2 --ntasks-per-node=2 --kill-on-bad-exit=1 "$prog" die-in-loop --victim 3 \
  --signal KILL --at 5 --death-file "$tmp/death" >"$out" 2>&1
rc=$?
end=$(date +%s.%N)
if [[ -s $tmp/death ]]; then
  took=$(echo "$end - $(cat "$tmp/death")" | bc)
  printf 'death to the end of the step: %.2f s\n' "$took"
  if [[ $rc != 0 ]] && [[ $(echo "$took <= 5" | bc) == 1 ]] &&
    grep -q "caught CommError.*peer rank 3" "$out"; then
    pass "a task killed mid-step: the step ended $(printf '%.2f' "$took") s after the death (bound 5 s), rank 3 named"
  else
    fail "a task killed mid-step: rc $rc, $(printf '%.2f' "$took") s after the death"
  fi
else
  fail "a task killed mid-step: the victim never died (rc $rc)"
fi

# 4. examples/slurm/train.sbatch as a user submits it, both ways (the batch script runs
#    srun itself; lockstep-run comes from PATH).
example=$(dirname "$0")/../../examples/slurm/train.sbatch
for launch in per-node per-rank; do
  out=$tmp/4-$launch.out
  PATH=$(dirname "$run"):$PATH LAUNCH=$launch timeout 150 sbatch --wait -N2 --ntasks-per-node=2 \
    --output="$out" "$example" "$prog" join >"$tmp/4-$launch.sbatch" 2>&1
  rc=$?
  [[ -f $out ]] || cp "$tmp/4-$launch.sbatch" "$out"
  if [[ $rc == 0 ]] && [[ $(grep -cE 'rank [0-3] joined$' "$out") == 4 ]] &&
    [[ $(grep -oE 'rank [0-3] joined$' "$out" | sort -u | wc -l) == 4 ]]; then
    pass "sbatch examples/slurm/train.sbatch (LAUNCH=$launch): one job of 4 ranks"
  else
    fail "sbatch examples/slurm/train.sbatch (LAUNCH=$launch) (rc $rc)"
  fi
done

echo "$passes passed, $failures failed"
[[ $failures == 0 ]]
