#!/usr/bin/env bash
# tensorboard_test.sh RUN TRAIN SRC PYTHON: lockstep-train on 2 ranks (configs/ctsm-tiny.toml,
# a TensorBoard scalar every step), then TensorBoard's own reader (the `tensorboard`
# package in PYTHON's environment) reads the event file and tensorboard_check.py compares
# every scalar with what the trainer logged in its CSV and eval.json.
set -uo pipefail
RUN=$1 TRAIN=$2 SRC=$3 PYTHON=$4
W=$(mktemp -d /tmp/lockstep-tensorboard.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$PYTHON" -c 'import tensorboard' 2>/dev/null ||
  fail "$PYTHON has no tensorboard package (make test-torch2 installs it into its venv)"
cd "$W" || exit 1
echo "== train 2 ranks, TensorBoard every step"
"$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$SRC/configs/ctsm-tiny.toml" \
  --set run.out_dir="$W/run" --set data.dir="$W/data" --set log.every_steps=1 \
  --set log.tensorboard=true > train.log 2>&1
rc=$?
tail -20 train.log
[[ $rc == 0 ]] || fail "training exited $rc"
echo "== read back with tensorboard.backend.event_processing.event_accumulator"
"$PYTHON" "$SRC/tests/packaging/tensorboard_check.py" "$W/run" || fail "TensorBoard's reader disagrees"
echo "PASS"
