#!/usr/bin/env bash
# strategy.comm_hook = "powersgd" on the tiny config at 2 ranks: compressed steps send fewer
# bytes than the plain allreduce; a run stopped after step 20 and resumed counts on from
# there (every resumed step compressed, none back to plain allreduce); the gate passes; a
# start_iter below 2 with error feedback is a config error naming the key and its line.
set -uo pipefail
RUN=$1 TRAIN=$2 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-powersgd.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"

train() {  # OUT_DIR HOOK [ARGS...]
  local out=$1 hook=$2
  shift 2
  "$RUN" --nproc-per-node 2 --master-port 0 "$TRAIN" "$CFG" --set run.out_dir="$W/$out" \
    --set data.dir="$W/data" --set log.progress=false --set strategy.comm_hook="$hook" \
    --set strategy.powersgd_start_iter=10 --set strategy.powersgd_rank=2 "$@" > "$out.log" 2>&1
}

echo "== plain allreduce, then powersgd (10 plain steps, then rank 2)"
train plain none || { cat plain.log; fail "plain run failed"; }
train psgd powersgd || { cat psgd.log; fail "powersgd run failed"; }
plain=$(summary "$W/plain/summary.json" bytes_per_step)
psgd=$(summary "$W/psgd/summary.json" bytes_per_step)
echo "bytes per step: plain $plain, powersgd (mean over 10 plain + 26 compressed steps) $psgd"
python3 -c "import sys; sys.exit(0 if $psgd * 2 < $plain else 1)" ||
  fail "powersgd sent $psgd bytes per step, plain $plain"
grep -q "quality gate passed" psgd.log || { cat psgd.log; fail "powersgd run missed the gate"; }
finite_losses "$W/psgd" > /dev/null || fail "non-finite loss"

echo "== stopped after step 20, resumed: the resumed steps are all compressed"
train res powersgd --set checkpoint.every_steps=5 --set train.stop_after_steps=20 ||
  { cat res.log; fail "first part failed"; }
train res powersgd --set checkpoint.every_steps=5 --resume || { cat res.log; fail "resume failed"; }
grep -q "at step 20" res.log || { cat res.log; fail "did not resume at step 20"; }
resumed=$(summary "$W/res/summary.json" bytes_per_step)
# Steps 21-36 only: each sends what a compressed step sends, i.e. (36 psgd - 10 plain) / 26.
python3 - "$plain" "$psgd" "$resumed" <<'PY' || fail "resumed steps were not all compressed"
import sys
plain, psgd, resumed = map(float, sys.argv[1:])
compressed = (36 * psgd - 10 * plain) / 26
print("compressed step: %.0f bytes, resumed run: %.0f bytes per step" % (compressed, resumed))
sys.exit(0 if abs(resumed - compressed) <= 0.02 * compressed else 1)
PY

echo "== config error names the key"
printf '[strategy]\ncomm_hook = "powersgd"\npowersgd_start_iter = 1\n' > bad.toml
"$TRAIN" bad.toml > bad.log 2>&1
rc=$?
[[ $rc == 2 ]] || { cat bad.log; fail "bad start_iter: exit $rc, expected 2"; }
grep -q "bad.toml:3:.*key 'strategy.powersgd_start_iter' = 1 must be >= 2" bad.log ||
  { cat bad.log; fail "error does not name the key and its line"; }
echo "PASS"
