#!/usr/bin/env bash
# lockstep-run --max-restarts 1: rank 1 is SIGKILLed mid-epoch (once the step-14 checkpoint
# exists, in epoch 1 of steps 13-24), the launcher restarts both ranks, and the restarted workers resume from the
# newest intact checkpoint without --resume (LOCKSTEP_RESTART_COUNT). The job completes
# with the same per-step losses and final parameters (CRC32) as an uninterrupted run, bit
# for bit (same world size, deterministic data order, dropout on).
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-restart.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
common=(--set data.dir="$W/data" --set checkpoint.every_steps=7 --set model.dropout=0.1
        --set log.plot=false --set log.tensorboard=false)

SECONDS=0
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/full" "${common[@]}" \
  > full.log 2>&1 || { cat full.log; fail "uninterrupted run"; }
echo "uninterrupted run: ${SECONDS} s"

# Rank 1 of the first attempt runs the trainer in the background and SIGKILLs it as soon as
# the step-14 checkpoint is complete (the run is then a few steps into epoch 1, steps
# 13-24); every other rank and attempt runs the trainer as is.
cat > kill_rank1.sh <<'SH'
#!/usr/bin/env bash
if [[ $RANK == 1 && $LOCKSTEP_RESTART_COUNT == 0 ]]; then
  "$@" & pid=$!
  for _ in $(seq 600); do [[ -d $CKPT/step-00000014 ]] && break; sleep 0.01; done
  step=$(($(wc -l < "$OUT/metrics/loss-rank-1.csv") - 1))
  echo "killing rank 1 (pid $pid) after step $step" >&2
  kill -9 $pid; wait $pid; exit $?
fi
exec "$@"
SH
SECONDS=0
CKPT=$W/part/checkpoints OUT=$W/part "$RUN" --nproc-per-node 2 --master-port 0 --max-restarts 1 \
  bash kill_rank1.sh "$TRAIN" "$CFG" --set run.out_dir="$W/part" "${common[@]}" > part.log 2>&1 ||
  { cat part.log; fail "restarted run"; }
echo "killed and restarted run: ${SECONDS} s"
grep "killing rank 1" part.log || { cat part.log; fail "rank 1 was not killed"; }
grep -q "restarting all 2 ranks (restart 1 of 1)" part.log || { cat part.log; fail "no restart"; }
grep -q "restart 1 of this job .*resuming from the newest intact checkpoint" part.log ||
  { cat part.log; fail "restart not noticed by the trainer"; }
grep "resumed from .*step-000000[0-9][0-9] at step" part.log || { cat part.log; fail "did not resume"; }

same_losses "$W/full" "$W/part"
same_summary "$W/full" "$W/part" param_crc32 final_loss steps
echo "PASS"
