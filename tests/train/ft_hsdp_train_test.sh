#!/usr/bin/env bash
# fault_tolerance.enable with HSDP replicas on the tiny config: 3 replicas of 2 ranks
# (lockstep-run --fault-tolerant --replica-size 2, strategy.kind = "fsdp": each replica
# shards the model over its 2 ranks; docs/fault-tolerance.md, "The trainer"):
#  - without faults the run follows FSDP at 6 ranks (AUC within 1e-4: the gradients are
#    averaged over 2 ranks, then over 3 replicas, where FSDP sums all 6 at once; the loss
#    is computed in float32) and every replica ends with the same parameters;
#  - a replica's second rank killed before the reduction of step 8: lockstep-run restarts
#    both its ranks, they heal their shards from a live replica, and the result follows the
#    fault-free run (loss within 1e-5 relative, AUC within 1e-4);
#  - two failures in a row: then replica 0's second rank killed as it heals the others;
#  - stopped at step 12 and resumed (replica 0's two ranks read their sharded checkpoint,
#    heal the others): the parameters of the uninterrupted run, bit for bit;
#  - strategy "ddp" with --replica-size 2, and "fsdp" without it: exit 2, naming the fix.
set -uo pipefail
RUN=$1 TRAIN=$2 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-ft-hsdp.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# A step run while a replica is down waits 200 ms, so a restart (seconds) comes back before
# the tiny job's end however fast the machine steps (a test hook of the replica loop).
export LOCKSTEP_TEST_DEGRADED_PAUSE_MS=200
cd "$W" || exit 1

COMMON=(--set data.dir="$W/data" --set log.progress=false --set train.reference_world_size=6
        --set train.epochs=20 --set checkpoint.every_steps=6 --set strategy.kind=fsdp)
hsdp() {  # OUT [lockstep-run flags...] -- [trainer args...]
  local out=$1
  shift
  local flags=()
  while [[ $# -gt 0 && $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  "$RUN" --fault-tolerant --replica-size 2 --nproc-per-node 6 --master-port 0 "${flags[@]}" \
    "$TRAIN" "$CFG" --set run.out_dir="$W/$out" --set fault_tolerance.enable=true "${COMMON[@]}" \
    "$@" > "$out.log" 2>&1
}
# same_replicas LOG NAME: three replicas finished, with the same parameters.
same_replicas() {
  [[ $(grep -c "ended at step" "$1") == 3 && $(crcs "$1" | wc -w) == 1 ]] ||
    { cat "$1"; fail "$2: not 3 replicas with the same parameters: $(crcs "$1")"; }
}

echo "== no faults: 3 HSDP replicas of 2 ranks follow FSDP at 6 ranks"
"$RUN" --nproc-per-node 6 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/fsdp" \
  "${COMMON[@]}" > fsdp.log 2>&1 || { cat fsdp.log; fail "fsdp run"; }
hsdp clean -- || { cat clean.log; fail "fault-free run"; }
same_replicas clean.log clean
# FSDP's final_loss is rank 0's alone: only the AUC compares.
follows "$W/fsdp" "$W/clean" 1
grep -q "3 replica(s) of 2 ranks, fault tolerant" clean.log || fail "the log does not say the layout"

echo "== replica 1's second rank killed before the reduction of step 8"
LOCKSTEP_TEST_REPLICA_KILL=reduce,8,1 hsdp kill --max-restarts 2 -- ||
  { cat kill.log; fail "kill: the job did not finish"; }
grep -q "restarting its replica's 2 ranks 2-3" kill.log || { cat kill.log; fail "kill: no restart of both"; }
grep -q "replica 1 ended at step 80" kill.log || { cat kill.log; fail "kill: replica 1 did not come back"; }
same_replicas kill.log kill
follows "$W/clean" "$W/kill"

echo "== two failures in a row: replica 1 killed at step 8, then replica 0 as it heals it"
LOCKSTEP_TEST_REPLICA_KILL="forward,8,1 heal,*,0" hsdp heal-kill --max-restarts 4 -- ||
  { cat heal-kill.log; fail "heal-kill: the job did not finish"; }
grep -q "replica 0 killed at heal" heal-kill.log || { cat heal-kill.log; fail "no kill at heal"; }
same_replicas heal-kill.log heal-kill
follows "$W/clean" "$W/heal-kill"

echo "== stopped after step 12, resumed: replica 0's ranks read their shards and heal the others"
hsdp resumed -- --set train.stop_after_steps=12 || { cat resumed.log; fail "first part"; }
hsdp resumed -- --resume || { cat resumed.log; fail "resume"; }
same_summary "$W/clean" "$W/resumed" param_crc32 metrics.auc

echo "== layouts the strategy cannot use: a clear error"
"$RUN" --fault-tolerant --replica-size 2 --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" \
  --set run.out_dir="$W/ddp2" --set fault_tolerance.enable=true "${COMMON[@]}" \
  --set strategy.kind=ddp > ddp2.log 2>&1
grep -q 'replica-size 2 makes replicas of 2 ranks, which strategy.kind = "ddp" cannot use' ddp2.log ||
  { cat ddp2.log; fail "ddp with --replica-size 2 was not refused"; }
"$RUN" --fault-tolerant --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" \
  --set run.out_dir="$W/fsdp1" --set fault_tolerance.enable=true "${COMMON[@]}" > fsdp1.log 2>&1
grep -q 'launch with lockstep-run --replica-size S, S >= 2 ranks per replica' fsdp1.log ||
  { cat fsdp1.log; fail "fsdp without --replica-size was not refused"; }
grep -q "usage or configuration error, which a restart would repeat" fsdp1.log ||
  { cat fsdp1.log; fail "fsdp1: the launcher did not see exit 2"; }
echo "PASS"
