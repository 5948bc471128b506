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
#     ranks 0..3 each join once;
#  5. sbatch examples/slurm/ctsm.sbatch with CONFIG=configs/ctsm-tiny.toml: lockstep-train on
#     4 ranks to completion (trained, evaluated, exported).
# The cluster: tests/multihost/slurm_cluster.sh (also used by bench/schedulers.sh).
# Skips (exit 77) with the reason where the daemons are missing or cannot start.
# usage: slurm_test.sh COLLECTIVES_CHECK FAULT_PROGRAM LOCKSTEP_RUN LOCKSTEP_TRAIN   (about 65 s)
set -u
check=$1; prog=$2; run=$3; train=$4
src=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=slurm_cluster.sh
source "$(dirname "$0")/slurm_cluster.sh"
# shellcheck source=../lib/checks.sh
source "$(dirname "$0")/../lib/checks.sh"
slurm_require
case_start=$SECONDS
# Each line with the seconds its case took; a FAIL with the case's output.
pass() { tally_pass "$* ($((SECONDS - case_start)) s)"; case_start=$SECONDS; }
fail() { tally_fail "$* ($((SECONDS - case_start)) s)"; case_start=$SECONDS; }
on_fail() { sed 's/^/    | /' "$out" | grep -v '\] \[c10d\] The IPv6 network addresses' | tail -30; }
slurm_start
tmp=$SLURM_DIR
me=$SLURM_NODE1
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

# 5. examples/slurm/ctsm.sbatch as a user submits it, on the tiny config (the script's own
#    CONFIG and OUT), a lockstep-run per node: trains, evaluates and exports to completion.
#    The tiny config keeps a global batch of 64 (2 ranks x 32), too few for 4 ranks of 32:
#    keep_global_batch=false trains 4 x 32 (its learning rate scaled linearly).
ctsm=$(dirname "$0")/../../examples/slurm/ctsm.sbatch
out=$tmp/5.out
PATH=$(dirname "$run"):$(dirname "$train"):$PATH CONFIG=$src/configs/ctsm-tiny.toml \
  OUT=$tmp/ctsm timeout 200 sbatch --wait -N2 --ntasks-per-node=2 --output="$out" "$ctsm" \
  --set train.keep_global_batch=false >"$tmp/5.sbatch" 2>&1
rc=$?
[[ -f $out ]] || cp "$tmp/5.sbatch" "$out"
if [[ $rc == 0 ]] && has "$out" "lockstep-run: Slurm (" && has "$out" " x 4 ranks " &&
  [[ -s $tmp/ctsm/export/ctsm.pt && -s $tmp/ctsm/summary.json ]]; then
  pass "sbatch examples/slurm/ctsm.sbatch (ctsm-tiny): 4 ranks trained and exported ($(grep -m1 -o 'effective batch: .*' "$out"))"
else
  fail "sbatch examples/slurm/ctsm.sbatch (ctsm-tiny) (rc $rc)"
fi

finish
