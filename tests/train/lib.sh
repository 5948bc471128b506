# shellcheck shell=bash
# Shared by the trainer's end-to-end tests (sourced; the shared shell libraries of the other
# tests are in tests/lib/): failing (the first failure ends the test), reading summary.json,
# checking the per-rank loss CSVs, comparing a resumed run with an uninterrupted one, and
# the fault-tolerant runs' parameter CRCs and final figures.
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

# crcs LOG: the distinct parameter CRCs the replicas of a fault-tolerant run printed when
# they finished (one line).
crcs() { grep -o "parameters crc32 [0-9]*" "$1" | sort -u | awk '{print $3}' | tr '\n' ' '; }

# follows A B [LOSS_TOL]: run B's final loss and AUC are A's within the tolerances (loss
# relative, default 1e-5: the model computes its loss in float32; AUC 1e-4).
follows() {
  python3 - "$1/summary.json" "$2/summary.json" "${3:-1e-5}" <<'PY' || fail "$2 does not follow $1"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
dl = abs(a["final_loss"] - b["final_loss"]) / abs(a["final_loss"])
da = abs(a["metrics"]["auc"] - b["metrics"]["auc"])
print("final loss rel diff %.2e (tol %s), auc diff %.2e (tol 1e-4)" % (dl, sys.argv[3], da))
assert dl < float(sys.argv[3]) and da < 1e-4
PY
}
