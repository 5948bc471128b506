# shellcheck shell=bash
# Shared by the trainer's end-to-end tests (sourced; the shared shell libraries of the other
# tests are in tests/lib/): failing (the first failure ends the test), reading summary.json,
# checking the per-rank loss CSVs, and comparing a resumed run with an uninterrupted one.
fail() { echo "FAIL: $*"; exit 1; }

# summary FILE KEY: KEY of summary.json's top level, or metrics.KEY.
summary() {
  python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(d['metrics'][sys.argv[2][8:]] if sys.argv[2].startswith('metrics.') else d[sys.argv[2]])" "$1" "$2"
}

# finite_losses RUN_DIR: every loss in the run's CSVs is finite; prints rank 0's row count
# (fails otherwise).
finite_losses() {
  python3 - "$1" <<'PY'
import csv, glob, math, sys
files = sorted(glob.glob(sys.argv[1] + "/metrics/loss-rank-*.csv"))
assert files, "no loss CSV in " + sys.argv[1]
for f in files:
    rows = list(csv.DictReader(open(f)))
    bad = [r for r in rows if not math.isfinite(float(r["loss"]))]
    assert rows and not bad, "%s: %d rows, non-finite: %s" % (f, len(rows), bad[:3])
print(len(list(csv.DictReader(open(files[0])))))
PY
}

# same_losses A B: runs A and B (their out_dirs) logged the same per-step losses on rank 0
# and rank 1 (the loss CSVs' first four columns); prints the step count per rank. Writes
# a.csv and b.csv in the working directory.
same_losses() {
  local r
  for r in 0 1; do
    cut -d, -f1-4 "$1/metrics/loss-rank-$r.csv" > a.csv
    cut -d, -f1-4 "$2/metrics/loss-rank-$r.csv" > b.csv
    diff a.csv b.csv > /dev/null || { diff a.csv b.csv | head; fail "$2: rank $r loss curve differs"; }
    echo "rank $r: $(($(wc -l < a.csv) - 1)) steps identical"
  done
}

# same_summary A B KEY...: the KEYs of runs A's and B's summary.json are equal (as summary
# reads them: top level or metrics.KEY); prints each.
same_summary() {
  local a=$1 b=$2
  shift 2
  python3 - "$a/summary.json" "$b/summary.json" "$@" <<'PY' || fail "$b: final state differs"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
get = lambda d, k: d["metrics"][k[8:]] if k.startswith("metrics.") else d[k]
for k in sys.argv[3:]:
    print(k, get(a, k), get(b, k)); assert get(a, k) == get(b, k), k
PY
}
