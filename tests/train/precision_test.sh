#!/usr/bin/env bash
# [precision], [memory] and the non-finite guard, end to end on configs/ctsm-tiny.toml
# (2 ranks, dropout 0.1):
#  (a) activation checkpointing changes nothing: the same parameters (CRC) as without it,
#      under DDP and under FSDP;
#  (b) bf16 autocast + pure-bf16 AnyPrecision AdamW (Kahan) + dynamic loss scaling trains
#      under DDP and FSDP with finite losses and passes the gate;
#  (c) a NaN injected on rank 1 at step 7 stops every rank at step 7 naming rank 1, and the
#      checkpoint of step 5 is intact and resumable; with train.non_finite = "skip" the run
#      completes with one skipped step;
#  plus the config errors of the new keys.
set -uo pipefail
RUN=$1 TRAIN=$2 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-precision.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
common=(--set data.dir="$W/data" --set model.dropout=0.1 --set log.plot=false --set log.progress=false
        --set train.epochs=1)
two() { "$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" "${common[@]}" "$@"; }

echo "== (a) activation checkpointing: same parameters as without"
for kind in ddp fsdp; do
  two --set strategy.kind=$kind --set run.out_dir="$W/$kind-plain" > $kind-plain.log 2>&1 ||
    { cat $kind-plain.log; fail "$kind plain"; }
  two --set strategy.kind=$kind --set run.out_dir="$W/$kind-ckpt" \
      --set memory.activation_checkpointing=true > $kind-ckpt.log 2>&1 ||
    { cat $kind-ckpt.log; fail "$kind checkpointed"; }
  a=$(summary "$W/$kind-plain/summary.json" param_crc32)
  b=$(summary "$W/$kind-ckpt/summary.json" param_crc32)
  echo "$kind: param CRC plain $a, checkpointed $b"
  [ "$a" = "$b" ] || fail "$kind: activation checkpointing changed the parameters"
done

echo "== (b) bf16 autocast + bf16 AnyPrecision AdamW (Kahan) + loss scaling"
for kind in ddp fsdp; do
  two --set strategy.kind=$kind --set run.out_dir="$W/$kind-bf16" \
      --set precision.autocast=bfloat16 --set precision.param_dtype=bfloat16 \
      --set precision.loss_scaling=dynamic --set optim.name=anyprecision_adamw \
      --set optim.kahan_summation=true --set optim.momentum_dtype=bfloat16 \
      --set optim.variance_dtype=bfloat16 --set optim.compensation_dtype=bfloat16 \
      --set memory.activation_checkpointing=true > $kind-bf16.log 2>&1 ||
    { cat $kind-bf16.log; fail "$kind bf16"; }
  finite_losses "$W/$kind-bf16" > /dev/null || fail "$kind bf16: non-finite loss"
  grep -q "quality gate passed" $kind-bf16.log || { cat $kind-bf16.log; fail "$kind bf16: gate"; }
  echo "$kind bf16: loss scale $(summary "$W/$kind-bf16/summary.json" loss_scale), $(grep -o 'auc [0-9.]*' $kind-bf16.log | head -1)"
done

echo "== (c) a NaN on rank 1 at step 7"
LOCKSTEP_FAULT_NONFINITE=7:1 two --set run.out_dir="$W/nan" --set checkpoint.every_steps=5 \
  > nan.log 2>&1 && { cat nan.log; fail "the run with a NaN succeeded"; }
grep -q "step 7: the loss is not finite on rank(s) 1" nan.log || { cat nan.log; fail "message"; }
[ "$(grep -c 'step 7: the loss is not finite on rank(s) 1' nan.log)" -ge 2 ] ||
  { cat nan.log; fail "not every rank stopped naming rank 1"; }
ls "$W/nan/checkpoints" | grep -q 5 || { ls -R "$W/nan"; fail "checkpoint of step 5 missing"; }
ls "$W/nan/checkpoints" | grep -q 7 && fail "a checkpoint was written at the non-finite step"
two --set run.out_dir="$W/nan" --set checkpoint.every_steps=5 --resume > resume.log 2>&1 ||
  { cat resume.log; fail "resume from the step-5 checkpoint"; }
LOCKSTEP_FAULT_NONFINITE=7:1 two --set run.out_dir="$W/skip" --set train.non_finite=skip \
  > skip.log 2>&1 || { cat skip.log; fail "skip run"; }
[ "$(summary "$W/skip/summary.json" skipped_steps)" = 1 ] || fail "skipped_steps != 1"
# With loss scaling the scaler skips the step and backs off; its scale survives a resume.
LOCKSTEP_FAULT_NONFINITE=3:1 two --set run.out_dir="$W/scaled" --set precision.loss_scaling=dynamic \
  --set checkpoint.every_steps=5 --set train.stop_after_steps=5 > scaled.log 2>&1 ||
  { cat scaled.log; fail "scaled run to step 5"; }
two --set run.out_dir="$W/scaled" --set precision.loss_scaling=dynamic --resume > scaled2.log 2>&1 ||
  { cat scaled2.log; fail "scaled resume"; }
[ "$(summary "$W/scaled/summary.json" loss_scale)" = 32768.0 ] ||
  fail "loss scale after resume: $(summary "$W/scaled/summary.json" loss_scale), want 32768.0"

echo "== config errors"
err() {  # err EXPECTED-REGEX ARGS...: the run fails naming the key
  local want=$1; shift
  "$TRAIN" "$CFG" "${common[@]}" "$@" > err.log 2>&1 && fail "accepted: $*"
  grep -qE "$want" err.log || { cat err.log; fail "no '$want' for: $*"; }
}
err "optim.kahan_summation.*anyprecision_adamw" --set optim.kahan_summation=true
err "precision.init_scale.*loss_scaling" --set precision.init_scale=1024
err "precision.autocast.*bfloat16" --set precision.autocast=float64
err "precision.param_dtype" --set precision.param_dtype=float16
echo "PASS"
