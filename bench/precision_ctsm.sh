#!/usr/bin/env bash
# Mixed precision on CTSM: configs/ctsm-demo.toml on 2 ranks in four precision variants,
# the same data, seeds and epochs; prints backtest AUC, its distance to fp32 AdamW, final
# loss and step time of each (issue 15: "AUC with bf16 autocast + AnyPrecision AdamW within
# 0.005 of fp32 AdamW"; "bf16 autocast step time vs fp32 on this CPU").
#
#   bench/precision_ctsm.sh LOCKSTEP_RUN LOCKSTEP_TRAIN SOURCE_DIR OUT_DIR [key=value ...]
#
#   A  fp32 AdamW (the config as is)
#   B  bf16 autocast, fp32 parameters, AdamW
#   C  bf16 autocast, bf16 parameters, AnyPrecision AdamW (Kahan, bf16 states)
#   D  C + activation checkpointing of the encoder layers
#
# Extra key=value arguments go to every variant as --set (e.g. train.epochs=4 on a slow
# machine: every variant must get the same). The event log is generated once in
# OUT_DIR/data and shared. Each variant runs in a fresh OUT_DIR/<variant> (no resume);
# its log is OUT_DIR/log-<variant>.txt, the table OUT_DIR/table.md. Exit 0 when all ran
# (a missed quality gate, exit 3, still counts as a run: its AUC is in the table), 1 when
# C is more than 0.005 AUC from A. Needs jq. Runs at the caller's priority: use nice.
set -euo pipefail

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 4 ]] || { usage >&2; exit 2; }
run=$1 train=$2 src=$(cd "$3" && pwd) out=$4
shift 4
for f in "$run" "$train"; do
  [[ -x "$f" ]] || { echo "not executable: $f (build lockstep-run and lockstep-train)" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "jq is needed (apt-get install jq)" >&2; exit 2; }
config=$src/configs/ctsm-demo.toml
[[ -f "$config" ]] || { echo "no $config: SOURCE_DIR must be the lockstep checkout" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

common=(--set "data.dir=$out/data" --set log.progress=false)
for kv in "$@"; do common+=(--set "$kv"); done

variants=(A B C D)
declare -A label=(
  [A]="fp32 AdamW"
  [B]="bf16 autocast, fp32 params, AdamW"
  [C]="bf16 autocast, bf16 params, AnyPrecision AdamW (Kahan, bf16 states)"
  [D]="C + activation checkpointing")
bf16_any=(--set precision.autocast=bfloat16 --set precision.param_dtype=bfloat16
  --set optim.name=anyprecision_adamw --set optim.kahan_summation=true
  --set optim.momentum_dtype=bfloat16 --set optim.variance_dtype=bfloat16
  --set optim.compensation_dtype=bfloat16)
variant_args() {
  case "$1" in
    A) ;;
    B) echo --set precision.autocast=bfloat16 ;;
    C) echo "${bf16_any[@]}" ;;
    D) echo "${bf16_any[@]}" --set memory.activation_checkpointing=true ;;
  esac
}

launch() { "$run" --nproc-per-node 2 --master-port 0 "$train" "$config" "$@"; }

echo "== generating the event log once into $out/data"
launch --generate-only "${common[@]}" --set "run.out_dir=$out/generate" >"$out/log-generate.txt" 2>&1 ||
  { cat "$out/log-generate.txt" >&2; exit 1; }

declare -A cpu
for v in "${variants[@]}"; do
  rm -rf "${out:?}/$v"
  read -r -a extra <<<"$(variant_args "$v")"
  echo "== $v: ${label[$v]} ($(date -u +%H:%M:%S) UTC)"
  rc=0
  # /usr/bin/time counts the ranks too: the launcher waits for them.
  /usr/bin/time -f '%U %S' -o "$out/cpu-$v.txt" \
    "$run" --nproc-per-node 2 --master-port 0 "$train" "$config" "${common[@]}" \
    --set "run.out_dir=$out/$v" "${extra[@]}" >"$out/log-$v.txt" 2>&1 || rc=$?
  if [[ $rc -ne 0 && $rc -ne 3 ]] || [[ ! -f "$out/$v/summary.json" ]]; then
    tail -20 "$out/log-$v.txt" >&2
    echo "variant $v failed (exit $rc)" >&2
    exit 1
  fi
  # The last line: a failing exit adds a "Command exited with non-zero status" line first.
  cpu[$v]=$(tail -1 "$out/cpu-$v.txt" | awk '{ printf "%.1f", $1 + $2 }')
  grep -E '^\[rank 0\].*(summary:|backtest|quality gate)' "$out/log-$v.txt" | sed 's/^/   /'
done

field() { jq -r "$2" "$out/$1/summary.json"; }
auc_a=$(field A .metrics.auc)
step_a=$(field A '.train_time_s / .steps_this_run')
cpu_a=$(awk -v c="${cpu[A]}" -v s="$(field A .steps_this_run)" 'BEGIN { print c / s }')
table=$out/table.md
{
  echo "| variant | AUC | \|AUC - A\| | final loss | step ms | samples/s | step vs A | CPU s | CPU/step vs A | skipped |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for v in "${variants[@]}"; do
    auc=$(field "$v" .metrics.auc)
    steps=$(field "$v" .steps_this_run)
    step=$(field "$v" '.train_time_s / .steps_this_run')
    awk -v v="$v" -v l="${label[$v]}" -v auc="$auc" -v a="$auc_a" \
      -v loss="$(field "$v" .final_loss)" -v step="$step" -v sa="$step_a" \
      -v sps="$(field "$v" .samples_per_s)" -v cpu="${cpu[$v]}" -v steps="$steps" \
      -v ca="$cpu_a" -v sk="$(field "$v" .skipped_steps)" 'BEGIN {
        d = auc - a; if (d < 0) d = -d
        printf "| %s: %s | %.4f | %.5f | %.4f | %.1f | %.1f | %.2fx | %.1f | %.2fx | %s |\n",
          v, l, auc, d, loss, step * 1000, sps, step / sa, cpu, (cpu / steps) / ca, sk }'
  done
} >"$table"
echo
echo "steps: $(field A .steps_this_run) per variant; step ms = train_time_s / steps (wall, rank 0);"
echo "CPU s = user + system of both ranks for the whole run (startup, training, backtest)"
cat "$table"

auc_c=$(field C .metrics.auc)
if awk -v c="$auc_c" -v a="$auc_a" 'BEGIN { d = c - a; if (d < 0) d = -d; exit !(d <= 0.005) }'; then
  echo "target met: |AUC(C) - AUC(A)| <= 0.005"
else
  echo "target missed: |AUC(C) - AUC(A)| > 0.005"
  exit 1
fi
