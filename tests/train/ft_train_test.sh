#!/usr/bin/env bash
# fault_tolerance.enable on the tiny config, 3 replicas under lockstep-run --fault-tolerant
# (docs/fault-tolerance.md, "The trainer"):
#  - without faults the parameters equal DDP's at 3 ranks, bit for bit;
#  - a replica killed in forward, before the reduction, at the vote, before the optimizer
#    step, while healing a joiner, or while writing a checkpoint: the job finishes, the
#    survivors discard at most the step it happened in, the restarted replica is healed, every
#    replica ends with the same parameters, and the result follows the fault-free run (loss
#    within 1e-5 relative: the model computes its loss in float32; AUC within 1e-4);
#    The same on gloo (the replicas' group; shm otherwise, all on one host);
#  - stopped at step 12 and resumed (replica 0 reads the checkpoint, heals the others): the
#    parameters of the uninterrupted run, bit for bit;
#  - a replica started by hand for 4 replicas joining a job of 3: exit 2 naming both counts,
#    the job goes on (its heal fails on the joiner alone);
#  - fault_tolerance.min_replicas = 3 with a replica lost and no restarts: exit 3, naming it.
set -uo pipefail
RUN=$1 TRAIN=$2 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-ft.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# A step run while a replica is down waits 200 ms, so a restart (seconds) comes back before
# the tiny job's end however fast the machine steps (a test hook of the replica loop).
export LOCKSTEP_TEST_DEGRADED_PAUSE_MS=200
cd "$W" || exit 1

COMMON=(--set data.dir="$W/data" --set log.progress=false --set train.reference_world_size=3
        --set train.epochs=10 --set checkpoint.every_steps=6)
ft() {  # OUT [lockstep-run flags...] -- [trainer args...]
  local out=$1
  shift
  local flags=()
  while [[ $# -gt 0 && $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  "$RUN" --fault-tolerant --nproc-per-node 3 --master-port 0 "${flags[@]}" "$TRAIN" "$CFG" \
    --set run.out_dir="$W/$out" --set fault_tolerance.enable=true "${COMMON[@]}" "$@" \
    > "$out.log" 2>&1
}


echo "== no faults: fault-tolerant replicas == DDP at 3 ranks, bit for bit"
"$RUN" --nproc-per-node 3 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/ddp" \
  "${COMMON[@]}" > ddp.log 2>&1 || { cat ddp.log; fail "ddp run"; }
ft clean -- || { cat clean.log; fail "fault-free run"; }
same_summary "$W/ddp" "$W/clean" param_crc32 steps metrics.auc
[[ $(crcs clean.log) == "$(summary "$W/clean/summary.json" param_crc32) " ]] ||
  fail "replicas ended with different parameters: $(crcs clean.log)"
python3 - "$W/clean/summary.json" <<'PY' || fail "summary.json's fault_tolerance record"
import json, sys
f = json.load(open(sys.argv[1]))["fault_tolerance"]
print(f)
assert f["committed_steps"] == 60 and f["discarded_steps"] == 0 and f["replicas_at_end"] == 3, f
PY

for point in forward reduce vote optimizer; do
  echo "== replica 1 killed at $point of step 8, restarted, healed"
  LOCKSTEP_TEST_REPLICA_KILL=$point,8,1 ft "kill-$point" --max-restarts 2 -- ||
    { cat "kill-$point.log"; fail "$point: the job did not finish"; }
  log=kill-$point.log
  grep -q "replica 1 killed at $point of step 8" "$log" || { cat "$log"; fail "$point: no kill"; }
  [[ $(crcs "$log" | wc -w) == 1 ]] || { cat "$log"; fail "$point: replicas differ: $(crcs "$log")"; }
  grep -q "replica 1 ended at step 60" "$log" || { cat "$log"; fail "$point: replica 1 did not come back"; }
  follows "$W/clean" "$W/kill-$point"
  python3 - "$W/kill-$point/summary.json" "$point" <<'PY' || { cat "$log"; fail "$point: record"; }
import json, sys
f = json.load(open(sys.argv[1]))["fault_tolerance"]
print(f)
assert f["committed_steps"] == 60 and f["heals_given"] >= 1 and f["replicas_at_end"] == 3, f
# Killed before its vote: the others discard step 8; after it (optimizer): nothing to discard.
assert f["discarded_steps"] == (0 if sys.argv[2] == "optimizer" else 1), f
PY
done

echo "== the replicas' group on gloo: replica 2 killed before the reduction of step 8"
LOCKSTEP_BACKEND=gloo LOCKSTEP_TEST_REPLICA_KILL=reduce,8,2 ft gloo --max-restarts 2 -- ||
  { cat gloo.log; fail "gloo: the job did not finish"; }
grep -q "\[gloo\]" gloo.log || { cat gloo.log; fail "gloo: the step did not fail on gloo"; }
[[ $(crcs gloo.log | wc -w) == 1 ]] || { cat gloo.log; fail "gloo: replicas differ"; }
follows "$W/clean" "$W/gloo"

echo "== two failures in a row: replica 1 killed at step 8, then replica 0 as it heals it"
LOCKSTEP_TEST_REPLICA_KILL="forward,8,1 heal,*,0" ft heal-kill --max-restarts 4 -- ||
  { cat heal-kill.log; fail "heal-kill: the job did not finish"; }
grep -q "replica 0 killed at heal" heal-kill.log || { cat heal-kill.log; fail "no kill at heal"; }
[[ $(crcs heal-kill.log | wc -w) == 1 ]] || { cat heal-kill.log; fail "replicas differ"; }
follows "$W/clean" "$W/heal-kill"

echo "== the writer of step 12's checkpoint killed mid-write"
LOCKSTEP_TEST_CHECKPOINT_KILL=write-mid,12,0 ft ckpt-kill --max-restarts 2 -- ||
  { cat ckpt-kill.log; fail "checkpoint kill: the job did not finish"; }
grep -q "killed at write-mid of the save of step 12" ckpt-kill.log || { cat ckpt-kill.log; fail "no kill"; }
[[ $(crcs ckpt-kill.log | wc -w) == 1 ]] || { cat ckpt-kill.log; fail "replicas differ"; }
follows "$W/clean" "$W/ckpt-kill"
compgen -G "$W/ckpt-kill/checkpoints/*.tmp" > /dev/null && fail "a .tmp checkpoint left behind"
[[ $(cat "$W/ckpt-kill/checkpoints/LATEST") == step-00000060 ]] || fail "LATEST is not step 60"

echo "== stopped after step 12, resumed: replica 0 reads the checkpoint and heals the others"
ft resumed -- --set train.stop_after_steps=12 || { cat resumed.log; fail "first part"; }
ft resumed -- --resume || { cat resumed.log; fail "resume"; }
same_summary "$W/clean" "$W/resumed" param_crc32 metrics.auc

echo "== a replica started by hand for another number of replicas: refused, the job goes on"
ft intruder -- --set train.epochs=40 &
job=$!
for ((t = 0; t < 100; t++)); do
  addr=$(grep -o "quorum service on [0-9.:]*" intruder.log | awk '{print $4}')
  [[ -n $addr ]] && grep -q "quorum 1:" intruder.log && break
  sleep 0.1
done
LOCKSTEP_COORDINATOR=$addr LOCKSTEP_REPLICA_ID=7 RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 \
  LOCAL_WORLD_SIZE=1 "$TRAIN" "$CFG" --set run.out_dir="$W/intruder-by-hand" \
  --set fault_tolerance.enable=true "${COMMON[@]}" --set train.reference_world_size=4 \
  --set train.epochs=40 > by-hand.log 2>&1
rc=$?
wait $job || { cat intruder.log; fail "the job did not go on"; }
[[ $rc == 2 ]] && grep -q "replica 7 was started as one of 4 replicas .* but the job it joins has 3" by-hand.log ||
  { cat by-hand.log; fail "the intruder: rc $rc"; }
[[ $(crcs intruder.log | wc -w) == 1 ]] || { cat intruder.log; fail "intruder: replicas differ"; }

echo "== fault_tolerance.min_replicas = 3, a replica lost, no restarts: a clean stop"
LOCKSTEP_TEST_REPLICA_KILL=forward,8,2 ft below-min -- --set fault_tolerance.min_replicas=3
rc=$?
[[ $rc == 3 ]] && grep -q "fewer than min_replicas (replica [0-9]'s) 3 replicas remain" below-min.log ||
  { cat below-min.log; fail "below min: rc $rc"; }
echo "PASS"
