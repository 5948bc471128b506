#!/usr/bin/env bash
# Asynchronous checkpoints (checkpoint.mode = "async", the default) at 2 ranks, DDP and FSDP:
#  (a) an async run and a sync run write the same checkpoint files byte for byte (model,
#      shard and RNG files, meta.json's files table; optimizer.pt's tensors: the file holds
#      addresses that differ between any two runs) and train identically;
#  (b) a rank killed at each point of the background write or of the commit of step 20's
#      checkpoint (the test-only hook LOCKSTEP_TEST_CHECKPOINT_KILL, see
#      src/train/checkpoint/checkpoint_writer.h) leaves step 10's checkpoint named by LATEST and
#      intact; --resume continues from it and follows the uninterrupted run bit for bit
#      (per-step losses on every rank, parameter CRC, metrics).
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
W=$(mktemp -d /tmp/lockstep-train-async-ckpt.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
common=(--set data.dir="$W/data" --set checkpoint.every_steps=10 --set model.dropout=0.1
        --set log.plot=false --set log.tensorboard=false --set eval.threshold=0)
two() { "$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$@"; }

# same_run A B: identical per-step losses on both ranks, parameter CRC and metrics.
same_run() {
  same_losses "$1" "$2"
  same_summary "$1" "$2" param_crc32 metrics.auc metrics.logloss
}

# same_files DIR_A DIR_B: every checkpoint file equal byte for byte, but optimizer.pt: torch
# names the parameters in it by their addresses in memory, which differ between any two
# runs (sync or async alike; the unit tests compare it byte for byte within one process),
# so its tensors' data records are compared (as a sorted list: the state's order follows
# the addresses too).
same_files() {
  local n=0
  for f in "$1"/*.pt; do
    [[ $(basename "$f") == optimizer.pt ]] && continue
    cmp -s "$f" "$2/$(basename "$f")" || fail "$(basename "$f") differs between $1 and $2"
    n=$((n + 1))
  done
  python3 - "$1" "$2" <<'PY' || fail "meta.json files tables or optimizer.pt tensors differ"
import json, os, sys, zipfile
a, b = (json.load(open(d + "/meta.json")) for d in sys.argv[1:])
fa = {k: v for k, v in a["files"].items() if k != "optimizer.pt"}
fb = {k: v for k, v in b["files"].items() if k != "optimizer.pt"}
assert fa == fb and a["step"] == b["step"], (fa, fb)
if os.path.exists(sys.argv[1] + "/optimizer.pt"):
    def records(d):
        z = zipfile.ZipFile(d + "/optimizer.pt")
        return sorted(z.read(n) for n in z.namelist() if "/data/" in n)
    ra, rb = records(sys.argv[1]), records(sys.argv[2])
    assert ra == rb, "optimizer.pt tensors differ"
    print("  optimizer.pt: %d tensor records identical" % len(ra))
PY
  echo "  $n other .pt files byte-identical, meta.json files tables equal ($(basename "$1"))"
}

# kill_and_resume CFG NAME POINT RANK: killed at POINT of step 20's save on RANK, then resumed.
kill_and_resume() {
  local cfg=$1 name=$2 point=$3 rank=$4 out=$W/$2
  LOCKSTEP_TEST_CHECKPOINT_KILL="$point,20,$rank" two "$cfg" --set run.out_dir="$out" \
    "${common[@]}" > "$name-1.log" 2>&1 && { cat "$name-1.log"; fail "$name: not killed"; }
  grep -q "rank $rank killed at $point of the save of step 20" "$name-1.log" ||
    { cat "$name-1.log"; fail "$name: the hook did not fire"; }
  [[ $(cat "$out/checkpoints/LATEST") == step-00000010 ]] || fail "$name: LATEST moved"
  two "$cfg" --set run.out_dir="$out" "${common[@]}" --resume > "$name-2.log" 2>&1 ||
    { cat "$name-2.log"; fail "$name: resume"; }
  grep -q "resumed from .*step-00000010 at step 10" "$name-2.log" ||
    { cat "$name-2.log"; fail "$name: did not resume from step 10"; }
  echo "$name: killed at $point (rank $rank), resumed from step 10"
}

for kind in ddp fsdp; do
  cfg=$SRC/configs/ctsm-tiny.toml
  [[ $kind == fsdp ]] && cfg=$SRC/configs/ctsm-fsdp.toml
  echo "== $kind (a) async and sync runs"
  two "$cfg" --set run.out_dir="$W/$kind-async" "${common[@]}" > "$kind-async.log" 2>&1 ||
    { cat "$kind-async.log"; fail "$kind async run"; }
  two "$cfg" --set run.out_dir="$W/$kind-sync" "${common[@]}" --set checkpoint.mode=sync \
    > "$kind-sync.log" 2>&1 || { cat "$kind-sync.log"; fail "$kind sync run"; }
  same_run "$W/$kind-async" "$W/$kind-sync"
  for s in 30 36; do
    same_files "$W/$kind-async/checkpoints/step-000000$s" "$W/$kind-sync/checkpoints/step-000000$s"
  done
  [[ $(cat "$W/$kind-async/checkpoints/LATEST") == step-00000036 ]] || fail "$kind: LATEST"
  ls "$W/$kind-async/checkpoints" | grep -q tmp && fail "$kind: a .tmp left behind"
  echo "== $kind (b) killed during the background write or the commit"
  points=("write-mid 1" "commit-latest 0")
  [[ $kind == ddp ]] && points=("write-start 1" "write-mid 0" "write-end 1" "commit-rename 0" "commit-latest 0")
  for pr in "${points[@]}"; do
    set -- $pr
    kill_and_resume "$cfg" "$kind-kill-$1" "$1" "$2"
    same_run "$W/$kind-async" "$W/$kind-kill-$1"
  done
done
echo "PASS"
