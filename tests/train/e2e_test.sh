#!/usr/bin/env bash
# End to end on the tiny config: generate -> train on 2 ranks -> backtest -> gate -> export
# -> reload the export in another program and score; plus the failure paths: gate miss,
# config errors (key + line), corrupt shard (file + record). TensorBoard files are read
# back by an independent standard-library reader.
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-e2e.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"

echo "== train 2 ranks"
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/run" --set data.dir="$W/data" \
  > train.log 2>&1
rc=$?
cat train.log
[[ $rc == 0 ]] || fail "training exited $rc"
for f in export/ctsm.pt export/model_card.json summary.json eval.json metrics/loss-rank-0.csv \
         metrics/loss-rank-1.csv loss.png; do
  [[ -s $W/run/$f ]] || fail "missing $f"
done
grep -q '"git_revision"' "$W/run/export/model_card.json" || fail "card has no git_revision"
grep -q '"eval_days"' "$W/run/export/model_card.json" || fail "card has no data range"
grep -q "effective batch: 32 per rank x 2 ranks x 1 accumulation = 64" train.log || fail "effective batch line"
# Each rank logged every step.
steps=$(python3 -c "import json;print(json.load(open('$W/run/summary.json'))['steps'])")
for r in 0 1; do
  n=$(($(wc -l < "$W/run/metrics/loss-rank-$r.csv") - 1))
  [[ $n == "$steps" ]] || fail "rank $r logged $n of $steps steps"
done

echo "== TensorBoard file, read independently"
tb=$(ls "$W"/run/tb/events.out.tfevents.*) || fail "no tfevents file"
/usr/bin/python3 "$SRC/tests/train/read_tfevents.py" "$tb" train/loss=3 train/lr=3 eval/auc=1 || fail "tfevents"

echo "== reload the export and score"
out=$("$SCORE" "$W/run/export" "$W/data" 300 65 32 10) || fail "scoring the export"
echo "$out"
python3 - "$W/run/eval.json" "$out" <<'PY' || fail "reloaded model scores differ from the trainer's backtest"
import json, sys
auc_train = json.load(open(sys.argv[1]))["metrics"]["auc"]
auc_reload = float(sys.argv[2].split()[1])
print("trainer auc %.6f, reloaded auc %.6f" % (auc_train, auc_reload))
sys.exit(0 if abs(auc_train - auc_reload) < 2e-3 else 1)
PY

echo "== gate miss: non-zero exit, states the shortfall, exports nothing"
"$TRAIN" "$CFG" --set run.out_dir="$W/miss" --set data.dir="$W/data" --set eval.threshold=0.99 \
  --set train.max_steps=3 > miss.log 2>&1
rc=$?
cat miss.log | tail -3
[[ $rc == 3 ]] || fail "gate miss exited $rc, want 3"
grep -q "missed by" miss.log || fail "gate miss message"
[[ ! -e $W/miss/export/ctsm.pt ]] || fail "exported despite missing the gate"

echo "== config errors name the key and the line"
printf '[run]\nname = "x"\n\n[optim]\nlr = 0.1\nlr_warmup = 3\n' > bad1.toml
"$TRAIN" bad1.toml > bad1.log 2>&1; rc=$?
cat bad1.log
[[ $rc == 2 ]] || fail "unknown key exited $rc"
grep -q "bad1.toml:6:.*unknown key 'optim.lr_warmup'" bad1.log || fail "unknown key message"
printf '[train]\nepochs = "3"\n' > bad2.toml
"$TRAIN" bad2.toml > bad2.log 2>&1; rc=$?
cat bad2.log
[[ $rc == 2 ]] || fail "wrong type exited $rc"
grep -q "bad2.toml:2:.*'train.epochs' must be an integer, got a string" bad2.log || fail "wrong type message"

echo "== corrupt shard names the file and the record"
cp -r "$W/data" "$W/bad"
shard=$W/bad/events-00001-of-00002.lse
python3 - "$shard" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); off = 64
for _ in range(7):  # skip records 0..6
    off += 8 + struct.unpack("<I", b[off:off + 4])[0]
b[off + 8 + 20] ^= 0xFF  # a byte inside record 7's payload
open(p, "wb").write(b)
PY
"$TRAIN" "$CFG" --set run.out_dir="$W/corrupt" --set data.dir="$W/bad" --set strategy.kind=single > corrupt.log 2>&1
rc=$?
cat corrupt.log | tail -2
[[ $rc == 1 ]] || fail "corrupt shard exited $rc"
grep -q "events-00001-of-00002.lse: record 7 of" corrupt.log || fail "corrupt shard message"
echo "PASS"
