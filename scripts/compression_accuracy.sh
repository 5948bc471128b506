#!/usr/bin/env bash
# Accuracy of QSGD gradient compression on the Fashion-MNIST demo: the same run (2 ranks,
# same seeds, same epochs) uncompressed, 4-bit/128 and 2-bit/128; prints a table of final
# test accuracies, keeps per-step loss CSVs and plots the loss curves with gnuplot.
#
#   scripts/compression_accuracy.sh BUILD_DIR [--epochs N] [--nproc N] [--out DIR]
#                                             [--png FILE] [--backend shm|gloo|mpi] [--reuse]
#
# Defaults: 2 epochs, 2 ranks, shm backend, CSVs and logs in BUILD_DIR/compression-accuracy,
# plot in docs/img/compression-loss.png. Requirement checked at the end: 4-bit within 0.5
# points of uncompressed (exit 1 otherwise). Needs gnuplot (apt-get install gnuplot-nox)
# for the plot only; without it the table is still produced. --reuse keeps the result of a
# mode whose log and CSV from an earlier run with the same --out are complete.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 1 && "$1" != -h && "$1" != --help ]] || { usage; exit 2; }
build=$(cd "$1" && pwd); shift
root=$(cd "$(dirname "$0")/.." && pwd)
reuse=0 epochs=2 nproc=2 backend=shm out="$build/compression-accuracy" png="$root/docs/img/compression-loss.png"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --nproc) nproc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --png) png=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --reuse) reuse=1; shift ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

run=$build/apps/lockstep-run
demo=$build/examples/fashion_mnist/fashion-mnist-ddp
for f in "$run" "$demo"; do
  [[ -x "$f" ]] || { echo "missing $f (build the targets lockstep-run and fashion-mnist-ddp)" >&2; exit 2; }
done
mkdir -p "$out" "$(dirname "$png")"

modes=(none qsgd4 qsgd2)
declare -A label=([none]="uncompressed fp32" [qsgd4]="QSGD 4-bit/128" [qsgd2]="QSGD 2-bit/128")
declare -A acc secs
final_acc() { sed -n 's/^\(\[rank 0\] \)\{0,1\}done: test accuracy \([0-9.]*\)%.*/\2/p' "$1" | tail -1; }
for m in "${modes[@]}"; do
  if [[ $reuse == 1 && -s "$out/loss-$m.csv" && -f "$out/log-$m.txt" && -n "$(final_acc "$out/log-$m.txt")" ]] &&
     grep -q "$epochs epoch(s)" "$out/log-$m.txt"; then
    echo "== $m: reusing $out/log-$m.txt"
    acc[$m]=$(final_acc "$out/log-$m.txt")
    secs[$m]=$(sed -n 's/.*done: .* in \([0-9]*\)\.[0-9]* s on.*/\1/p' "$out/log-$m.txt" | tail -1)
    continue
  fi
  echo "== $m: $nproc ranks, $epochs epoch(s), backend $backend"
  start=$(date +%s)
  # No LOCKSTEP_COMPRESSION_* from the caller's environment: the flag decides.
  env -u LOCKSTEP_COMPRESSION_BITS -u LOCKSTEP_COMPRESSION_BUCKET_SIZE \
      -u LOCKSTEP_COMPRESSION_ERROR_FEEDBACK LOCKSTEP_BACKEND="$backend" \
    "$run" --nproc-per-node "$nproc" --master-port 0 "$demo" \
      --epochs "$epochs" --seed 0 --compression "$m" --loss-csv "$out/loss-$m.csv" \
      --progress-every 25 2>&1 | tee "$out/log-$m.txt"
  secs[$m]=$(( $(date +%s) - start ))
  a=$(final_acc "$out/log-$m.txt")
  [[ -n "$a" ]] || { echo "run $m produced no final accuracy (see $out/log-$m.txt)" >&2; exit 1; }
  acc[$m]=$a
done

table="$out/accuracy.md"
{
  echo "| gradients | final test accuracy | vs uncompressed | wall time |"
  echo "|---|---|---|---|"
  for m in "${modes[@]}"; do
    d=$(awk -v a="${acc[$m]}" -v b="${acc[none]}" 'BEGIN { printf "%+.2f", a - b }')
    echo "| ${label[$m]} | ${acc[$m]}% | $d points | ${secs[$m]} s |"
  done
} > "$table"
echo; cat "$table"

if command -v gnuplot > /dev/null; then
  gnuplot -e "dir='$out'; out='$png'; epochs='$epochs'; nproc='$nproc'" \
    "$root/scripts/plot_compression_loss.gnuplot"
  echo "plot: $png"
else
  echo "gnuplot not found: no plot (apt-get install gnuplot-nox)" >&2
fi

ok=$(awk -v a="${acc[qsgd4]}" -v b="${acc[none]}" 'BEGIN { print (b - a <= 0.5) ? 1 : 0 }')
if [[ $ok == 1 ]]; then
  echo "4-bit within 0.5 points of uncompressed: yes"
else
  echo "4-bit within 0.5 points of uncompressed: NO (${acc[qsgd4]}% vs ${acc[none]}%)" >&2
  exit 1
fi
