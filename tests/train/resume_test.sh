#!/usr/bin/env bash
# A run interrupted at step 10 and resumed with --resume follows the uninterrupted run
# bit for bit at the same world size (2 ranks): identical per-step losses and lr on
# every rank, identical final parameters (CRC32) and backtest metrics.
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-resume.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$W"
common=(--set data.dir="$W/data" --set checkpoint.every_steps=10 --set model.dropout=0.1 --set log.plot=false)

"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/full" "${common[@]}" \
  > full.log 2>&1 || { cat full.log; fail "uninterrupted run"; }
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/part" "${common[@]}" \
  --set train.stop_after_steps=13 > part1.log 2>&1 || { cat part1.log; fail "first half"; }
grep -q "stopped after step 13" part1.log || { cat part1.log; fail "did not stop at step 13"; }
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/part" "${common[@]}" --resume \
  > part2.log 2>&1 || { cat part2.log; fail "resumed half"; }
grep -q "resumed from .*step-00000013 at step 13" part2.log || { cat part2.log; fail "did not resume at 13"; }

for r in 0 1; do
  cut -d, -f1-4 "$W/full/metrics/loss-rank-$r.csv" > a.csv
  cut -d, -f1-4 "$W/part/metrics/loss-rank-$r.csv" > b.csv
  diff a.csv b.csv > /dev/null || { diff a.csv b.csv | head; fail "rank $r loss curve differs"; }
  echo "rank $r: $(($(wc -l < a.csv) - 1)) steps identical"
done
python3 - "$W/full/summary.json" "$W/part/summary.json" <<'PY' || fail "final state differs"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for k in ("param_crc32", "final_loss"):
    print(k, a[k], b[k]); assert a[k] == b[k], k
for k in ("auc", "recall_at_k", "logloss"):
    print(k, a["metrics"][k], b["metrics"][k]); assert a["metrics"][k] == b["metrics"][k], k
PY
echo "PASS"
