#!/usr/bin/env bash
# strategy.kind = "fsdp" end to end on configs/ctsm-fsdp.toml (2 ranks):
#  (a) trains with finite losses, passes its gate, and the export (written from the
#      gathered parameters) reloads into a plain model and scores like the trainer's backtest;
#  (b) a run stopped at step 13 and resumed from its sharded checkpoint follows the
#      uninterrupted run bit for bit (per-step losses on every rank, parameter CRC, metrics);
#  (c) the 2-rank checkpoint resumes on 1 rank: with lr = 0 the parameters are exactly the
#      checkpoint's (the same CRC as a 2-rank resume with lr = 0, not the initial model's),
#      and a normal resume completes the run;
#  (d) compressed traffic (strategy.gather_bits = 8, reduce_bits = 4): fewer bytes per step,
#      AUC within 0.01 of (a)'s, and a run stopped at 13 resumes bit for bit (the 4-bit
#      rounding follows the step);
#  plus the errors: a DDP comm hook with fsdp, an unknown sharding, a DDP resume of an FSDP
#  checkpoint, compression keys without a sharded FSDP.
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
CFG=$SRC/configs/ctsm-fsdp.toml
W=$(mktemp -d /tmp/lockstep-train-fsdp.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
common=(--set data.dir="$W/data" --set checkpoint.every_steps=10 --set model.dropout=0.1 --set log.plot=false)
two() { "$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" "$@"; }
one() { "$TRAIN" "$CFG" "$@"; }

echo "== (a) train on 2 ranks"
SECONDS=0
two --set run.out_dir="$W/full" "${common[@]}" > full.log 2>&1 || { cat full.log; fail "uninterrupted run"; }
echo "uninterrupted run: ${SECONDS} s"
grep -q "strategy fsdp (.*), sharding full_shard, wrap all" full.log || { cat full.log; fail "strategy line"; }
ls "$W"/full/checkpoints/step-00000036/fsdp-shard-0000{0,1}.pt > /dev/null || fail "no shard files"
[[ ! -e $W/full/checkpoints/step-00000036/model.pt ]] || fail "an FSDP checkpoint holds model.pt"
rows=$(finite_losses "$W/full") || fail "losses"
[[ $rows == 36 ]] || fail "rank 0 logged $rows of 36 steps"
loss=$(summary "$W/full/summary.json" final_loss)
python3 -c "import math,sys; sys.exit(0 if math.isfinite($loss) else 1)" || fail "final loss $loss"
echo "final loss $loss, 36 steps"
out=$("$SCORE" "$W/full/export" "$W/data" 300 65 32 10) || fail "scoring the export"
python3 - "$W/full/eval.json" "$out" <<'PY' || fail "reloaded model scores differ from the trainer's backtest"
import json, sys
auc_train = json.load(open(sys.argv[1]))["metrics"]["auc"]
auc_reload = float(sys.argv[2].split()[1])
print("trainer auc %.6f, reloaded export auc %.6f" % (auc_train, auc_reload))
sys.exit(0 if abs(auc_train - auc_reload) < 2e-3 else 1)
PY

echo "== (b) stop at 13, resume on 2 ranks: bit for bit"
two --set run.out_dir="$W/part" "${common[@]}" --set train.stop_after_steps=13 > part1.log 2>&1 ||
  { cat part1.log; fail "first half"; }
grep -q "stopped after step 13" part1.log || { cat part1.log; fail "did not stop at step 13"; }
for d in one zero1 zero2 ddp; do cp -r "$W/part" "$W/$d"; done
two --set run.out_dir="$W/part" "${common[@]}" --resume > part2.log 2>&1 || { cat part2.log; fail "resumed half"; }
grep -q "resumed from .*step-00000013 at step 13$" part2.log || { cat part2.log; fail "did not resume at 13"; }
same_losses "$W/full" "$W/part"
same_summary "$W/full" "$W/part" param_crc32 final_loss metrics.auc metrics.recall_at_k metrics.logloss

echo "== (c) the 2-rank checkpoint on 1 rank"
two --set run.out_dir="$W/zero2" "${common[@]}" --set optim.lr=0 --resume > zero2.log 2>&1 ||
  { cat zero2.log; fail "2-rank resume with lr 0"; }
one --set run.out_dir="$W/zero1" "${common[@]}" --set optim.lr=0 --resume > zero1.log 2>&1 ||
  { cat zero1.log; fail "1-rank resume with lr 0"; }
grep -q "at step 13 (written by 2 ranks, resharded onto 1)" zero1.log || { cat zero1.log; fail "reshard line"; }
a=$(summary "$W/zero2/summary.json" param_crc32) b=$(summary "$W/zero1/summary.json" param_crc32)
echo "step-13 parameters: crc32 $a on 2 ranks, $b resharded onto 1"
[[ $a == "$b" ]] || fail "the resharded parameters differ from the checkpoint's"
one --set run.out_dir="$W/init" "${common[@]}" --set optim.lr=0 --set train.max_steps=1 \
  --set eval.threshold=0 > init.log 2>&1 || { cat init.log; fail "1-step run with lr 0"; }
init=$(summary "$W/init/summary.json" param_crc32)
echo "initial parameters: crc32 $init"
[[ $init != "$a" ]] || fail "the resumed runs hold the initial parameters, not the checkpoint's"
SECONDS=0
one --set run.out_dir="$W/one" "${common[@]}" --resume > one.log 2>&1 || { cat one.log; fail "1-rank resume"; }
echo "1-rank resume to the end: ${SECONDS} s"
grep -q "2 accumulation = 64 examples/step" one.log || { cat one.log; fail "1-rank effective batch"; }
rows=$(finite_losses "$W/one") || fail "1-rank losses"
[[ $rows == 36 ]] || fail "1-rank resume logged $rows of 36 steps"
echo "1 rank: final loss $(summary "$W/one/summary.json" final_loss), auc $(summary "$W/one/summary.json" metrics.auc)"

echo "== (d) 8-bit gathers, 4-bit reduce-scatters"
q=(--set strategy.gather_bits=8 --set strategy.reduce_bits=4)
two --set run.out_dir="$W/q" "${common[@]}" "${q[@]}" > q.log 2>&1 || { cat q.log; fail "compressed run"; }
two --set run.out_dir="$W/qpart" "${common[@]}" "${q[@]}" --set train.stop_after_steps=13 > q1.log 2>&1 ||
  { cat q1.log; fail "compressed first half"; }
two --set run.out_dir="$W/qpart" "${common[@]}" "${q[@]}" --resume > q2.log 2>&1 || { cat q2.log; fail "compressed resume"; }
same_losses "$W/q" "$W/qpart"
same_summary "$W/q" "$W/qpart" param_crc32 final_loss metrics.auc
python3 - "$W/full/summary.json" "$W/q/summary.json" <<'PY' || fail "compressed traffic"
import json, sys
a, q = (json.load(open(p)) for p in sys.argv[1:])
print("bytes/step %d plain, %d compressed (%.2fx fewer); auc %.4f plain, %.4f compressed"
      % (a["bytes_per_step"], q["bytes_per_step"], a["bytes_per_step"] / q["bytes_per_step"],
         a["metrics"]["auc"], q["metrics"]["auc"]))
sys.exit(0 if q["bytes_per_step"] < 0.5 * a["bytes_per_step"]
         and abs(q["metrics"]["auc"] - a["metrics"]["auc"]) < 0.01 else 1)
PY

echo "== errors"
one --set strategy.kind=ddp --set strategy.gather_bits=8 > qddp.log 2>&1; rc=$?
cat qddp.log
[[ $rc == 2 ]] || fail "gather_bits with ddp exited $rc"
grep -q "'strategy.gather_bits' = 8 compresses FSDP's collectives, but strategy.kind = \"ddp\"" qddp.log ||
  fail "gather_bits with ddp message"
one --set strategy.sharding=no_shard --set strategy.reduce_bits=4 > qns.log 2>&1; rc=$?
cat qns.log
[[ $rc == 2 ]] || fail "reduce_bits with no_shard exited $rc"
grep -q "'strategy.reduce_bits' = 4: strategy.sharding = \"no_shard\"" qns.log || fail "no_shard message"
one --set run.out_dir="$W/ddp" "${common[@]}" --set strategy.kind=ddp --resume > ddp.log 2>&1; rc=$?
cat ddp.log
[[ $rc == 2 ]] || fail "DDP resume of an FSDP checkpoint exited $rc"
grep -q 'written with strategy.kind = "fsdp"' ddp.log || fail "DDP resume message"
one --set strategy.comm_hook=bf16 > hook.log 2>&1; rc=$?
cat hook.log
[[ $rc == 2 ]] || fail "comm_hook with fsdp exited $rc"
grep -q "'strategy.comm_hook' = 'bf16' is a DDP communication hook" hook.log || fail "comm_hook message"
one --set strategy.sharding=zero3 > shard.log 2>&1; rc=$?
cat shard.log
[[ $rc == 2 ]] || fail "unknown sharding exited $rc"
grep -q "'strategy.sharding' = 'zero3' is not one of: full_shard, shard_grad_op, no_shard, hybrid_shard" shard.log ||
  fail "sharding message"
echo "PASS"
