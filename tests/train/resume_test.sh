#!/usr/bin/env bash
# A run interrupted at step 13 and resumed with --resume follows the uninterrupted run
# bit for bit at the same world size (2 ranks): identical per-step losses and lr on
# every rank, identical final parameters (CRC32) and backtest metrics. The same 2-rank
# DDP checkpoint also resumes on 1 rank (the global batch fixed by keep_global_batch):
# with lr = 0 the parameters are exactly the checkpoint's, and a normal resume completes.
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-resume.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
common=(--set data.dir="$W/data" --set checkpoint.every_steps=10 --set model.dropout=0.1 --set log.plot=false)

"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/full" "${common[@]}" \
  > full.log 2>&1 || { cat full.log; fail "uninterrupted run"; }
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/part" "${common[@]}" \
  --set train.stop_after_steps=13 > part1.log 2>&1 || { cat part1.log; fail "first half"; }
grep -q "stopped after step 13" part1.log || { cat part1.log; fail "did not stop at step 13"; }
for d in zero1 zero2 one; do cp -r "$W/part" "$W/$d"; done
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/part" "${common[@]}" --resume \
  > part2.log 2>&1 || { cat part2.log; fail "resumed half"; }
grep -q "resumed from .*step-00000013 at step 13" part2.log || { cat part2.log; fail "did not resume at 13"; }

same_losses "$W/full" "$W/part"
same_summary "$W/full" "$W/part" param_crc32 final_loss metrics.auc metrics.recall_at_k metrics.logloss
echo "== the 2-rank DDP checkpoint on 1 rank"
zero=(--set optim.lr=0 --set eval.threshold=0 --resume)
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/zero2" "${common[@]}" "${zero[@]}" \
  > zero2.log 2>&1 || { cat zero2.log; fail "2-rank resume with lr 0"; }
"$TRAIN" "$CFG" --set run.out_dir="$W/zero1" "${common[@]}" "${zero[@]}" > zero1.log 2>&1 ||
  { cat zero1.log; fail "1-rank resume with lr 0"; }
grep -q "at step 13 (written by 2 ranks, continuing on 1)" zero1.log || { cat zero1.log; fail "world-size line"; }
a=$(summary "$W/zero2/summary.json" param_crc32) b=$(summary "$W/zero1/summary.json" param_crc32)
echo "step-13 parameters: crc32 $a on 2 ranks, $b on 1"
[[ $a == "$b" ]] || fail "the parameters loaded on 1 rank differ from the checkpoint's"
"$TRAIN" "$CFG" --set run.out_dir="$W/init" "${common[@]}" --set optim.lr=0 --set eval.threshold=0 \
  --set train.max_steps=1 > init.log 2>&1 || { cat init.log; fail "1-step run with lr 0"; }
init=$(summary "$W/init/summary.json" param_crc32)
echo "initial parameters: crc32 $init"
[[ $init != "$a" ]] || fail "the resumed runs hold the initial parameters, not the checkpoint's"
"$TRAIN" "$CFG" --set run.out_dir="$W/one" "${common[@]}" --resume > one.log 2>&1 || { cat one.log; fail "1-rank resume"; }
grep -q "1 rank.* x 2 accumulation = 64" one.log || { cat one.log; fail "1-rank effective batch"; }
rows=$(($(wc -l < "$W/one/metrics/loss-rank-0.csv") - 1))
steps=$(summary "$W/full/summary.json" steps)
[[ $rows == "$steps" ]] || fail "1-rank resume logged $rows of $steps steps"
echo "1 rank from the 2-rank checkpoint: $rows steps, final loss $(summary "$W/one/summary.json" final_loss) (2 ranks: $(summary "$W/full/summary.json" final_loss))"
echo "PASS"
