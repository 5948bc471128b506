#!/usr/bin/env bash
# strategy.sharding = "hybrid_shard" on 2 "nodes" x 2 ranks (tests/multiprocess/nodes.sh):
#  (a) trains, passes its gate, with 4-bit gradients too; the first replica alone writes the
#      shard files, named by the ranks of its node (every rank writes its RNG);
#  (b) follows full_shard over the 4 ranks (the same averages, summed in another order):
#      final loss within 1e-3, AUC within 0.005;
#  (c) a run stopped at step 7 resumes bit for bit (every replica reads the first's shards);
#  (d) full_shard with secondary_shards (hpZ: the backward gathers inside each node) ends
#      with full_shard's parameters bit for bit, sending fewer bytes;
#  plus the errors: hybrid_shard under fault tolerance, secondary_shards without full_shard.
set -uo pipefail
RUN=$1 TRAIN=$2 SRC=$4
CFG=$SRC/configs/ctsm-fsdp.toml
W=$(mktemp -d /tmp/lockstep-train-hybrid.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
common=(--set data.dir="$W/data" --set checkpoint.every_steps=5 --set log.plot=false
        --set train.keep_global_batch=false)
nodes() { bash "$SRC/tests/multiprocess/nodes.sh" "$RUN" 2 2 "$TRAIN" "$CFG" "${common[@]}" "$@"; }
hybrid=(--set strategy.sharding=hybrid_shard)

echo "== (a) hybrid_shard, 2 nodes x 2 ranks"
nodes --set run.out_dir="$W/h" "${hybrid[@]}" > h.log 2>&1 || { cat h.log; fail "hybrid run"; }
grep -q "sharding hybrid_shard" h.log || { cat h.log; fail "strategy line"; }
grep -q "quality gate passed" h.log || { cat h.log; fail "gate"; }
last=$(ls -d "$W"/h/checkpoints/step-* | tail -1)
files=$(cd "$last" && ls | tr '\n' ' ')
echo "$(basename "$last") files: $files"
[[ $files == "fsdp-shard-00000.pt fsdp-shard-00001.pt meta.json rng-rank-0.pt rng-rank-1.pt rng-rank-2.pt rng-rank-3.pt " ]] ||
  fail "checkpoint files"
nodes --set run.out_dir="$W/hq" "${hybrid[@]}" --set strategy.reduce_bits=4 > hq.log 2>&1 ||
  { cat hq.log; fail "hybrid run with 4-bit gradients"; }

echo "== (b) against full_shard over the 4 ranks"
nodes --set run.out_dir="$W/f" > f.log 2>&1 || { cat f.log; fail "full_shard run"; }
python3 - "$W/h/summary.json" "$W/f/summary.json" "$W/hq/summary.json" <<'PY' || fail "hybrid differs from full_shard"
import json, sys
h, f, q = (json.load(open(p)) for p in sys.argv[1:])
print("final loss %.6f hybrid, %.6f full_shard, %.6f hybrid 4-bit; auc %.4f, %.4f, %.4f"
      % (h["final_loss"], f["final_loss"], q["final_loss"],
         h["metrics"]["auc"], f["metrics"]["auc"], q["metrics"]["auc"]))
sys.exit(0 if abs(h["final_loss"] - f["final_loss"]) < 1e-3
         and abs(h["metrics"]["auc"] - f["metrics"]["auc"]) < 0.005
         and abs(q["metrics"]["auc"] - f["metrics"]["auc"]) < 0.01 else 1)
PY

echo "== (c) stop at 7, resume: bit for bit"
nodes --set run.out_dir="$W/p" "${hybrid[@]}" --set train.stop_after_steps=7 > p1.log 2>&1 ||
  { cat p1.log; fail "first half"; }
nodes --set run.out_dir="$W/p" "${hybrid[@]}" --resume > p2.log 2>&1 || { cat p2.log; fail "resume"; }
grep -q "resumed from .*step-00000007 at step 7" p2.log || { cat p2.log; fail "did not resume at 7"; }
same_losses "$W/h" "$W/p"
same_summary "$W/h" "$W/p" param_crc32 final_loss metrics.auc

echo "== (d) full_shard with hpZ's secondary shards"
nodes --set run.out_dir="$W/s" --set strategy.secondary_shards=true > s.log 2>&1 || { cat s.log; fail "hpZ run"; }
same_summary "$W/f" "$W/s" param_crc32 final_loss metrics.auc
a=$(summary "$W/f/summary.json" bytes_per_step) b=$(summary "$W/s/summary.json" bytes_per_step)
echo "bytes per step: $a full_shard, $b with hpZ (its backward gathers over 2 ranks, not 4)"
(( b < a )) || fail "hpZ did not shrink the backward gathers"

echo "== errors"
"$TRAIN" "$CFG" "${hybrid[@]}" --set strategy.secondary_shards=true > sec.log 2>&1; rc=$?
cat sec.log
[[ $rc == 2 ]] || fail "secondary_shards with hybrid_shard exited $rc"
grep -q "'strategy.secondary_shards' = true keeps FSDP full_shard's parameters" sec.log ||
  fail "secondary_shards message"
"$TRAIN" "$CFG" "${hybrid[@]}" --set fault_tolerance.enable=true > ft.log 2>&1; rc=$?
cat ft.log
[[ $rc == 2 ]] || fail "hybrid_shard under fault tolerance exited $rc"
grep -q "'strategy.sharding' = 'hybrid_shard': under fault_tolerance.enable = true" ft.log ||
  fail "fault tolerance message"
echo "PASS"
