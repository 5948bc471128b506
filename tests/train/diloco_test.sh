#!/usr/bin/env bash
# strategy.kind = "diloco" on the tiny config at 2 ranks: a round of 6 steps sends under a
# quarter of DDP's bytes per step and passes the gate; Streaming DiLoCo (3 fragments,
# exchange overlapped by 1 step, mixing 0.5, 4-bit) stopped mid-round with an exchange in
# flight and resumed ends with the parameters of the uninterrupted run, bit for bit, with
# asynchronous and with synchronous checkpoints; a resume on another world size, and values
# that do not fit the strategy, are config errors naming the cause.
set -uo pipefail
RUN=$1 TRAIN=$2 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-diloco.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"

train() {  # OUT_DIR NPROC KIND [ARGS...]
  local out=$1 np=$2 kind=$3
  shift 3
  "$RUN" --nproc-per-node "$np" --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/$out" \
    --set data.dir="$W/data" --set log.progress=false --set strategy.kind="$kind" "$@" \
    >> "$out.log" 2>&1
}

echo "== DDP, then DiLoCo with 6 inner steps per round"
train ddp 2 ddp || { cat ddp.log; fail "ddp run failed"; }
train dl 2 diloco --set strategy.diloco_inner_steps=6 --set eval.every_steps=6 ||
  { cat dl.log; fail "diloco run failed"; }
ddp=$(summary "$W/ddp/summary.json" bytes_per_step)
dl=$(summary "$W/dl/summary.json" bytes_per_step)
echo "bytes per step: ddp $ddp, diloco $dl"
python3 -c "import sys; sys.exit(0 if $dl * 4 < $ddp else 1)" || fail "diloco sent $dl, ddp $ddp"
grep -q "quality gate passed" dl.log || { cat dl.log; fail "diloco run missed the gate"; }
finite_losses "$W/dl" > /dev/null || fail "non-finite loss"
# eval.every_steps = 6: metrics/eval.csv has the AUC after every round (36 steps), the last
# one the run's final AUC, with the training seconds growing.
python3 - "$W/dl" <<'PY' || fail "eval.csv does not hold the evaluation curve"
import csv, json, sys
rows = [r for r in csv.DictReader(open(sys.argv[1] + "/metrics/eval.csv")) if r["metric"] == "auc"]
steps = [int(r["step"]) for r in rows]
train_s = [float(r["train_s"]) for r in rows]
final = json.load(open(sys.argv[1] + "/summary.json"))["metrics"]["auc"]
print("eval.csv: auc at steps", steps, "->", [round(float(r["value"]), 4) for r in rows])
assert steps == [6, 12, 18, 24, 30, 36], steps
assert train_s == sorted(train_s) and train_s[0] > 0, train_s
assert abs(float(rows[-1]["value"]) - final) < 1e-6, (rows[-1], final)
PY

STREAM=(--set strategy.diloco_inner_steps=6 --set strategy.diloco_fragments=3
        --set strategy.diloco_overlap_steps=1 --set strategy.diloco_mixing=0.5
        --set strategy.diloco_compression=qsgd)
for mode in async sync; do
  echo "== streaming, $mode checkpoints: stopped after step 14 (fragment 0's exchange in flight), resumed"
  train "full-$mode" 2 diloco "${STREAM[@]}" --set checkpoint.mode=$mode ||
    { cat "full-$mode.log"; fail "uninterrupted run failed"; }
  train "res-$mode" 2 diloco "${STREAM[@]}" --set checkpoint.mode=$mode \
    --set checkpoint.every_steps=7 --set train.stop_after_steps=14 ||
    { cat "res-$mode.log"; fail "first part failed"; }
  train "res-$mode" 2 diloco "${STREAM[@]}" --set checkpoint.mode=$mode \
    --set checkpoint.every_steps=7 --resume || { cat "res-$mode.log"; fail "resume failed"; }
  grep -q "at step 14" "res-$mode.log" || { cat "res-$mode.log"; fail "did not resume at 14"; }
  a=$(summary "$W/full-$mode/summary.json" param_crc32)
  b=$(summary "$W/res-$mode/summary.json" param_crc32)
  echo "parameters: crc32 $a uninterrupted, $b stopped and resumed"
  [[ "$a" == "$b" ]] || fail "$mode: resumed parameters differ from the uninterrupted run's"
done

echo "== resume on another world size"
train res-async 1 diloco "${STREAM[@]}" --resume
grep -q "written by 2 DiLoCo replicas.*resume on 2 ranks" res-async.log ||
  { cat res-async.log; fail "no error naming the world size"; }

echo "== config errors name the key"
bad() {  # EXPECTED_REGEX TOML
  printf "$2" > bad.toml
  "$TRAIN" bad.toml > bad.log 2>&1
  local rc=$?
  [[ $rc == 2 ]] || { cat bad.log; fail "exit $rc, expected 2 for: $2"; }
  grep -q "$1" bad.log || { cat bad.log; fail "error does not say '$1'"; }
}
bad "bad.toml:4:.*key 'strategy.diloco_overlap_steps' = 5: must be in \[0, inner_steps)" \
  '[strategy]\nkind = "diloco"\ndiloco_inner_steps = 5\ndiloco_overlap_steps = 5\n'
bad "bad.toml:3:.*key 'strategy.comm_hook' = 'qsgd' is a DDP communication hook" \
  '[strategy]\nkind = "diloco"\ncomm_hook = "qsgd"\n'
echo "PASS"
