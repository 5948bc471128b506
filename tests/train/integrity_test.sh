#!/usr/bin/env bash
# Checkpoint integrity on 2 ranks (docs/checkpoints.md). A run stopped at step 20 has
# checkpoints at 10 and 20; for every kind of file of step 20 (DDP: meta.json, model.pt,
# optimizer.pt, rng-rank-0/1.pt; FSDP: fsdp-shard-00000/1.pt) a flipped byte and a
# truncation each give one line naming the file with the expected and found checksum or
# size, and resume skips step 20 and continues from step 10. Also: a damaged LATEST, a
# legacy checkpoint (no checksums) whose truncated model.pt libtorch cannot parse (one
# line, libtorch's trace only with LOCKSTEP_DEBUG=1), no intact checkpoint at all (exit 1),
# an intact checkpoint of another model (exit 1, no fallback), and rotation keeping the
# checkpoint written after a fallback.
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
W=$(mktemp -d /tmp/lockstep-train-integrity.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
common=(--set data.dir="$W/data" --set checkpoint.every_steps=10 --set checkpoint.keep=3
        --set log.plot=false --set log.tensorboard=false)
two() { "$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$@"; }
flip() {  # flip one byte in the middle of $1
  python3 -c "import sys;p=sys.argv[1];b=bytearray(open(p,'rb').read());b[len(b)//2]^=0x5a;open(p,'wb').write(b)" "$1"
}
truncate_half() { python3 -c "import os,sys;p=sys.argv[1];os.truncate(p,os.path.getsize(p)//2)" "$1"; }

# damage CFG BASE FILE HOW: copy run BASE, damage step-20/FILE, resume for one step.
damage() {
  local cfg=$1 base=$2 file=$3 how=$4 name="$2-${3%.*}-$4"
  cp -r "$W/$base" "$W/$name"
  local path=$W/$name/checkpoints/step-00000020/$file
  if [[ $how == flip ]]; then flip "$path"; else truncate_half "$path"; fi
  two "$cfg" --set run.out_dir="$W/$name" "${common[@]}" --set train.stop_after_steps=11 --resume \
    > "$name.log" 2>&1 || { cat "$name.log"; fail "$name: resume failed"; }
  local line
  line=$(grep -o "step-00000020/$file: .*" "$name.log" | head -1)
  [[ -n $line ]] || { cat "$name.log"; fail "$name: no error names $file"; }
  echo "$name: $line"
  if [[ $file == meta.json ]]; then
    grep -qE "step-00000020/meta.json: damaged: (not valid JSON|expected crc32)" "$name.log" ||
      fail "$name: meta.json message"
  elif [[ $how == flip ]]; then
    grep -qE "step-00000020/$file: damaged: expected crc32 [0-9a-f]{8}, found [0-9a-f]{8}" "$name.log" ||
      fail "$name: flip message"
  else
    grep -qE "step-00000020/$file: truncated or damaged: expected [0-9]+ bytes with crc32 [0-9a-f]{8}, found [0-9]+ bytes" "$name.log" ||
      fail "$name: truncation message"
  fi
  grep -q "skipping damaged checkpoint .*step-00000020" "$name.log" || fail "$name: no skip warning"
  grep -q "resumed from .*step-00000010 at step 10$" "$name.log" || { cat "$name.log"; fail "$name: no fallback to 10"; }
  ! grep -q "frame #" "$name.log" || fail "$name: a stack trace"
}

SECONDS=0
for kind in ddp fsdp; do
  cfg=$SRC/configs/ctsm-tiny.toml; [[ $kind == fsdp ]] && cfg=$SRC/configs/ctsm-fsdp.toml
  two "$cfg" --set run.out_dir="$W/$kind" "${common[@]}" --set train.stop_after_steps=20 > "$kind.log" 2>&1 ||
    { cat "$kind.log"; fail "$kind: first run"; }
  ls "$W/$kind/checkpoints/step-00000010" "$W/$kind/checkpoints/step-00000020" > /dev/null || fail "$kind: checkpoints"
  # meta.json and the RNG files are written and read alike under both strategies.
  files=(fsdp-shard-00000.pt fsdp-shard-00001.pt)
  [[ $kind == ddp ]] && files=(meta.json rng-rank-0.pt rng-rank-1.pt model.pt optimizer.pt)
  for f in "${files[@]}"; do
    for how in flip truncate; do damage "$cfg" "$kind" "$f" "$how"; done
  done
done
echo "damage cases: ${SECONDS} s"
CFG=$SRC/configs/ctsm-tiny.toml

echo "== LATEST names nothing: every checkpoint, newest first"
cp -r "$W/ddp" "$W/latest"
printf 'step-0000002X\n' > "$W/latest/checkpoints/LATEST"
two "$CFG" --set run.out_dir="$W/latest" "${common[@]}" --set train.stop_after_steps=21 --resume > latest.log 2>&1 ||
  { cat latest.log; fail "damaged LATEST"; }
grep -q "LATEST names 'step-0000002X', which is no checkpoint directory; trying every" latest.log || fail "LATEST note"
grep -q "resumed from .*step-00000020 at step 20$" latest.log || fail "LATEST: resume at 20"

echo "== a legacy checkpoint (no checksums) with a truncated model.pt"
cp -r "$W/ddp" "$W/legacy"
for s in 10 20; do
  python3 - "$W/legacy/checkpoints/step-000000$s/meta.json" <<'PY'
import json, sys
p = sys.argv[1]; m = json.load(open(p))
for k in ("files", "meta_crc32"): m.pop(k)
m["version"] = 1
json.dump(m, open(p, "w"), indent=2)
PY
done
truncate_half "$W/legacy/checkpoints/step-00000020/model.pt"
cp -r "$W/legacy" "$W/legacy-debug"
two "$CFG" --set run.out_dir="$W/legacy" "${common[@]}" --set train.stop_after_steps=11 --resume > legacy.log 2>&1 ||
  { cat legacy.log; fail "legacy resume"; }
grep -q "step-00000020 has no checksums (written before lockstep recorded them): loading it unverified" legacy.log ||
  fail "legacy warning"
grep "step-00000020/model.pt: libtorch cannot load it (damaged or truncated?): " legacy.log | head -1
grep -q "step-00000020/model.pt: libtorch cannot load it (damaged or truncated?): .*LOCKSTEP_DEBUG=1" legacy.log ||
  { cat legacy.log; fail "legacy: libtorch message"; }
grep -q "resumed from .*step-00000010 at step 10$" legacy.log || fail "legacy: fallback to 10"
n=$(grep -c "frame #" legacy.log); [[ $n == 0 ]] || fail "legacy: $n stack frames without LOCKSTEP_DEBUG"
LOCKSTEP_DEBUG=1 "$TRAIN" "$CFG" --set strategy.kind=single --set run.out_dir="$W/legacy-debug" "${common[@]}" \
  --set train.stop_after_steps=11 --resume > debug.log 2>&1
grep -q "frame #" debug.log && echo "LOCKSTEP_DEBUG=1: libtorch's trace printed ($(grep -c 'frame #' debug.log) frames)" ||
  { cat debug.log; fail "no trace with LOCKSTEP_DEBUG=1"; }

echo "== no intact checkpoint: exit 1 naming the directory"
cp -r "$W/ddp" "$W/none"
for s in 10 20; do flip "$W/none/checkpoints/step-000000$s/optimizer.pt"; done
two "$CFG" --set run.out_dir="$W/none" "${common[@]}" --resume > none.log 2>&1; rc=$?
grep "no intact checkpoint" none.log | head -2
[[ $rc == 1 ]] || { cat none.log; fail "no intact checkpoint exited $rc"; }
grep -q "resume: no intact checkpoint in $W/none/checkpoints (tried 2, newest .*step-00000020)" none.log ||
  fail "no-intact message"

echo "== an intact checkpoint of another model: exit 1 on every rank, no fallback"
cp -r "$W/ddp" "$W/other"
two "$CFG" --set run.out_dir="$W/other" "${common[@]}" --set model.d_ff=128 --resume > other.log 2>&1; rc=$?
grep "does not fit" other.log | head -1
[[ $rc == 1 ]] || { cat other.log; fail "another model exited $rc"; }
grep -q "step-00000020/model.pt: intact (checksum ok) but it does not fit this run: 'layers.0.ff1.bias' is \[64\] in the checkpoint, \[128\] in this model" other.log ||
  fail "another model: message"
! grep -q "skipping damaged" other.log || fail "another model: fell back"

echo "== rotation after a fallback keeps the new checkpoint (keep = 1)"
cp -r "$W/ddp" "$W/rot"
flip "$W/rot/checkpoints/step-00000020/model.pt"
two "$CFG" --set run.out_dir="$W/rot" "${common[@]}" --set checkpoint.keep=1 --set checkpoint.every_steps=7 \
  --set train.stop_after_steps=14 --resume > rot.log 2>&1 || { cat rot.log; fail "rotation run"; }
ls "$W/rot/checkpoints"
[[ -d $W/rot/checkpoints/step-00000014 ]] || fail "rotation deleted the checkpoint it just wrote"
[[ ! -d $W/rot/checkpoints/step-00000010 ]] || fail "rotation kept an older one than keep = 1 allows"
[[ $(cat "$W/rot/checkpoints/LATEST") == step-00000014 ]] || fail "LATEST"
echo "PASS"
