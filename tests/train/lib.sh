# Shared by the trainer's end-to-end tests (sourced): failing, reading summary.json, and
# checking the per-rank loss CSVs.
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
