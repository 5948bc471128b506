#!/usr/bin/env bash
# Fault-tolerant replicas (lockstep::ft::Manager under lockstep-run --fault-tolerant, 3
# replicas, docs/fault-tolerance.md): one replica killed, stopped or leaving at each point
# of a step, two failures in a row, the quorum service killed, and fewer replicas than
# --min-replicas. Where the job goes on: the survivors commit their next step within
# $bound s of the failure (5 s for a stopped one: found after 3 s silent), the restarted
# replica heals from a live one, the job exits 0, and every replica that finished holds
# the same bits, equal to a single-process replay of who committed which step
# (ft_program check: fp64, within 1e-12), in which every sample was used exactly once per
# completed epoch (lockstep::data::ElasticSampler, healed with the model).
# usage: ft_test.sh FT_PROGRAM LOCKSTEP_RUN BACKEND   (BACKEND: shm | gloo)
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
tally_tag="[$backend]"

# Jobs (ft_lib.sh's job) of 3 one-rank replicas, 200 steps (about 20 ms a step: time for a
# restarted replica to start and join before the others finish, even on a loaded host).
# shellcheck disable=SC2034  # read by ft_lib.sh's job
layout=(--nproc-per-node 3)
# shellcheck disable=SC2034
train_flags=()
steps=200


# went_on NAME VICTIMS LIMIT: exit 0; each survivor committed within LIMIT s of the
# failure; the replicas agree with each other and with the replay.
went_on() {
  local name=$1 victims=$2 limit=$3 r s
  if [[ $rc == 0 ]]; then pass "$name: the job finished (exit 0)"
  else fail "$name: exit $rc"; fi
  for r in 0 1 2; do
    [[ ,$victims, == *,$r,* ]] && continue
    s=$(first_commit_after "$dir" "$r")
    if [[ -n $s ]] && le "$s" "$limit"; then
      pass "$name: replica $r committed its next step $s s after the failure"
    else fail "$name: replica $r's next commit came ${s:-never} after the failure (bound $limit s)"; fi
  done
  local verdict; verdict=$("$prog" check "$dir" --steps "$steps")
  if [[ $(grep -c '^PASS' <<<"$verdict") == 3 ]]; then
    pass "$name: $(sed -n 2p <<<"$verdict" | cut -c6-)"
    pass "$name: $(sed -n 3p <<<"$verdict" | cut -c6-)"
  else fail "$name: $verdict"; fi
}

# healed NAME VICTIM: the restarted victim received the state of a live replica.
healed() {
  if grep -q "\[rank $2\] replica $2 done: .* 1 heals" "$out"; then
    pass "$1: the restarted replica $2 healed from a live one: $(grep -o "1 heals ([^)]*)" "$out")"
  else fail "$1: replica $2 did not heal"; fi
}

# One failure at each point of a step; the victim is restarted and heals.
victim=0
for point in forward backward allreduce vote optimizer; do
  job "kill-$point" "$victim:8:$point:kill" --max-restarts 1
  went_on "kill-$point" "$victim" "$bound"
  healed "kill-$point" "$victim"
  victim=$(((victim + 1) % 3))
done

# Stopped (SIGSTOP): never exits, so never restarted; the others drop it (3 s silent) and
# finish; lockstep-run then ends it.
job stop-backward 1:8:backward:stop --max-restarts 1
went_on stop-backward 1 5
check "stop-backward: lockstep-run ended the stopped replica once the job was done" \
  has "$out" "the job is done; only stopped replicas are left"

# An error of its own, caught, and a return from main (not a signal).
job leave-vote 2:8:vote:leave --max-restarts 1
went_on leave-vote 2 "$bound"
healed leave-vote 2

# Two failures in a row: replica 2 in step 8, then replica 1 in the next step.
job two-kills 2:8:backward:kill,1:9:forward:kill --max-restarts 2
went_on two-kills 1,2 "$bound"
healed two-kills 1
healed two-kills 2

# Below --min-replicas: a clean stop that says why, with the service's exit code 3.
job below-min 2:8:backward:kill --min-replicas 3
if [[ $rc == 3 ]] && has "$out" "stopping the job: fewer than --min-replicas 3 replicas remain (2: 0,1)" &&
  has "$out" "the quorum service stopped the job"; then
  pass "below-min: exit 3, naming --min-replicas 3 and the 2 replicas left"
else fail "below-min: exit $rc: $(grep -m2 'quorum service' "$out" | tail -1)"; fi

# Elastic join: a replica started by hand (as on a new node) joins the running 2-replica
# job at a step boundary, heals, and finishes with the others.
dir=$tmp/join; out=$tmp/join.out; mkdir -p "$dir"
timeout 120 "$run" --fault-tolerant --nproc-per-node 2 --grace-seconds 2 \
  "$prog" train "$dir" --steps 150 >"$out" 2>&1 &
launcher=$!
wait_until 30 grep -qF "quorum service: quorum 1:" "$out" 2>/dev/null
address=$(grep -o 'quorum service on [^ ]*' "$out" | cut -d' ' -f4)
LOCKSTEP_COORDINATOR=$address LOCKSTEP_REPLICA_ID=2 timeout 120 "$prog" train "$dir" --steps 150 \
  >"$tmp/joiner.out" 2>&1
joiner_rc=$?
wait "$launcher"; rc=$?
if [[ $rc == 0 && $joiner_rc == 0 ]] && grep -q "quorum service: quorum 2: replicas 0,1,2 (3)" "$out" &&
  grep -q "replica 2 done: .* 1 heals" "$tmp/joiner.out"; then
  pass "join: a third replica joined the running job, healed and finished: $(grep -o '[0-9]* committed, .*heals ([^)]*)' "$tmp/joiner.out")"
else fail "join: job exit $rc, joiner exit $joiner_rc: $(tail -2 "$tmp/joiner.out")"; fi
verdict=$("$prog" check "$dir" --steps 150 --replicas 3)
if [[ $(grep -c '^PASS' <<<"$verdict") == 3 ]]; then pass "join: $(sed -n 2p <<<"$verdict" | cut -c6-)"
else fail "join: $verdict"; fi

# The quorum service killed: the one single point of failure ends the job, clearly, fast.
dir=$tmp/service; out=$tmp/service.out; mkdir -p "$dir"
timeout 120 "$run" --fault-tolerant --nproc-per-node 3 --grace-seconds 2 \
  "$prog" train "$dir" --steps 100000 >"$out" 2>&1 &
launcher=$!
wait_until 30 grep -qF "quorum service: quorum 1:" "$out" 2>/dev/null
# Not while the replicas build their first group: ranks killed between rank 0's creating
# the shm segment and everyone's mapping it (when it is unlinked) would leave it behind.
sleep 1
service=$(grep -o 'quorum service on [^ ]* (pid [0-9]*' "$out" | grep -o '[0-9]*$')
killed_at=$(now)
kill -9 "$service"
wait "$launcher"; rc=$?
took=$(echo "$(now) - $killed_at" | bc)
if [[ $rc == 1 ]] && has "$out" "the quorum service (pid $service) killed by signal 9" &&
  has "$out" "single point of failure" && le "$took" 10; then
  pass "service-killed: the job ended ${took} s after the service's death, exit 1, saying so"
else fail "service-killed: exit $rc after ${took} s: $(grep -m1 'quorum service (pid' "$out")"; fi

finish
