#!/usr/bin/env bash
# Fault-tolerant HSDP replicas (lockstep::ft::Manager with ManagerOptions::replica_group,
# under lockstep-run --fault-tolerant --replica-size 2; docs/fault-tolerance.md): 3
# replicas of 2 ranks each, the model one FSDP FullShard unit inside a replica, the
# cross-replica reduction of each shard over its own group. One rank of a replica killed,
# stopped or failing at each point of a step, its replica's rank 0 (which speaks to the
# quorum service) or the other one: the survivors discard the step and commit the next
# within $bound s (5 s for a stopped rank: its mate sees it after 3 s), lockstep-run
# restarts the whole replica, both its ranks heal from the same live replica, the job
# exits 0, and every replica's gathered parameters are bit-identical and equal to a
# single-process replay (ft_program check, as in ft_test.sh). And a Manager not given the
# replica's group is refused, naming the fix.
# usage: ft_hsdp_test.sh FT_PROGRAM LOCKSTEP_RUN BACKEND   (BACKEND: shm | gloo)
set -u
prog=$1; run=$2; backend=$3
bound=3
export LOCKSTEP_BACKEND=$backend
tmp=$(mktemp -d); trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/checks.sh
source "$here/../lib/checks.sh"
# shellcheck source=ft_lib.sh
source "$here/ft_lib.sh"
tally_tag="[hsdp $backend]"

# Jobs (ft_lib.sh's job) of 3 replicas of 2 ranks, 150 steps.
# shellcheck disable=SC2034  # read by ft_lib.sh's job
layout=(--replica-size 2 --nproc-per-node 6)
# shellcheck disable=SC2034
train_flags=(--hsdp)
steps=150

# went_on NAME VICTIM LIMIT: as ft_test.sh's, and the victim's whole replica restarted and
# healed, each of its two ranks once.
went_on() {
  local name=$1 victim=$2 limit=$3 r s
  if [[ $rc == 0 ]]; then pass "$name: the job finished (exit 0)"
  else fail "$name: exit $rc"; fi
  for r in 0 1 2; do
    [[ $r == "$victim" ]] && continue
    s=$(first_commit_after "$dir" "$r")
    if [[ -n $s ]] && le "$s" "$limit"; then
      pass "$name: replica $r committed its next step $s s after the failure"
    else fail "$name: replica $r's next commit came ${s:-never} after the failure (bound $limit s)"; fi
  done
  local first=$((2 * victim)) last=$((2 * victim + 1))
  check "$name: lockstep-run restarted replica $victim's two ranks together" \
    has "$out" "(replica $victim) failed"
  check "$name: ... as ranks $first-$last" has "$out" "restarting its replica's 2 ranks $first-$last"
  if [[ $(grep -cE "replica $victim shard [01] done: .* 1 heals" "$out") == 2 ]]; then
    pass "$name: both of its ranks healed their shards from a live replica"
  else fail "$name: replica $victim's ranks did not both heal"; fi
  local verdict; verdict=$("$prog" check "$dir" --steps "$steps")
  if [[ $(grep -c '^PASS' <<<"$verdict") == 3 ]]; then
    pass "$name: $(sed -n 1p <<<"$verdict" | cut -c6-)"
    pass "$name: $(sed -n 3p <<<"$verdict" | cut -c6-)"
  else fail "$name: $verdict"; fi
}

# VICTIM.SHARD:STEP:POINT:KIND (shard 0 is the rank that speaks to the quorum service).
job kill-shard1-allreduce 0.1:8:allreduce:kill --max-restarts 1
went_on kill-shard1-allreduce 0 "$bound"
job kill-shard0-backward 1.0:8:backward:kill --max-restarts 1
went_on kill-shard0-backward 1 "$bound"
job kill-shard1-forward 2.1:8:forward:kill --max-restarts 1
went_on kill-shard1-forward 2 "$bound"
job kill-shard0-vote 0.0:8:vote:kill --max-restarts 1
went_on kill-shard0-vote 0 "$bound"
job leave-shard1-optimizer 1.1:8:optimizer:leave --max-restarts 1
went_on leave-shard1-optimizer 1 "$bound"
job stop-shard1-backward 2.1:8:backward:stop --max-restarts 1
went_on stop-shard1-backward 2 5

# Two failures in a row: replica 1's rank 0 killed, then the rank 1 of the replica healing
# it, as it saves its shard: the joiner's rank 0 got its shard, its rank 1 did not, and the
# whole joiner must count as not healed (once it did not: the two ranks disagreed on their
# step and the job discarded every step after).
job heal-kill 1.0:8:forward:kill,0.1:*:heal:kill --max-restarts 2
if [[ $rc == 0 ]] && has "$out" "restarting its replica's 2 ranks 0-1" &&
  [[ $(grep -cE "replica 1 shard [01] done: " "$out") == 2 ]]; then
  pass "heal-kill: the job finished (exit 0) after both replicas were restarted"
else fail "heal-kill: exit $rc"; fi
verdict=$("$prog" check "$dir" --steps "$steps")
if [[ $(grep -c '^PASS' <<<"$verdict") == 3 ]]; then pass "heal-kill: $(sed -n 1p <<<"$verdict" | cut -c6-)"
else fail "heal-kill: $verdict"; fi

# The Manager must be given the replica's group: without it, a clear refusal.
dir=$tmp/no-group; out=$tmp/no-group.out; mkdir -p "$dir"
timeout 60 "$run" --fault-tolerant --replica-size 2 --nproc-per-node 2 --grace-seconds 1 \
  "$prog" train "$dir" --steps 5 >"$out" 2>&1
rc=$?
check "no-group: a Manager without the replica's group is refused, naming the fix (exit $rc)" \
  has "$out" "this replica was started as 2 ranks (lockstep-run --replica-size 2) but the Manager was given no replica group"

finish
