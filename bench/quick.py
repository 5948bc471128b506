#!/usr/bin/python3
"""make bench-quick: short runs of lockstep-bench that catch performance regressions.

    bench/quick.py [--build build] [--strict] [--update] [--save FILE] [--baseline FILE]

Runs short versions of the lockstep-bench subcommands (under 3 minutes on 2 cores),
collects the figures below, prints them as one JSON object (name -> {value, unit,
higher_is_better, absolute}) and compares each with bench/baseline.json, which holds the
same keys plus a relative noise band ("tolerance") per key:

  allreduce_4KiB_shm_over_mpi    time of lockstep's shm allreduce / OpenMPI's, 2 ranks
  allreduce_64MiB_shm_over_mpi   the same at 64 MiB (both: median of 3 runs' ratios)
  ddp_step_over_pytorch          lockstep DDP step (shm) / PyTorch DDP step (gloo), 2 ranks
  qsgd4_allreduce_speedup_1gbit  fp32 allreduce time / 4-bit QSGD allreduce time, 64 MiB,
                                 2 ranks over loopback shaped to 1 Gbit/s (needs root)
  fsdp_full_shard_step_over_ddp  lockstep FSDP FULL_SHARD step / lockstep DDP step
  qsgd4_encode_gbs_per_core      4-bit QSGD codec, GB/s of float32 on one core: absolute,
  qsgd4_decode_add_gbs_per_core  not a ratio (thread CPU time, best of 3 tables)

Every figure but the codec's is a ratio of two things measured in the same run, so a
loaded machine moves it less than it moves either time. A figure worse than its baseline
by more than its tolerance is flagged WORSE. The exit status is 0 unless --strict is given
and a figure is WORSE (noisy machines then break nobody by default). A peer that is not
installed (OpenMPI, Debian's python3-torch) or a shaped link that cannot be made (no
root) leaves its figure out with a line saying why; a missing figure is reported, never
counted as a regression. --update writes the figures of this run as the new baseline,
keeping each key's tolerance (and the old entry of a figure this run did not measure).

Only the Python standard library: runs with Debian's python3, no virtual environment.
"""
import argparse
import csv
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
DEFAULT_BASELINE = os.path.join(HERE, "baseline.json")
DEFAULT_TOLERANCE = 0.30  # for a key the baseline has no band for yet
STEP_TIMEOUT_S = 240      # one subcommand; a hung job is killed with its process group
COLLECTIVES_RUNS = 3      # the collectives ratios: median of this many runs
CODEC_RUNS = 3            # the codec figures: best of this many tables


# ---------------------------------------------------------------- comparison (pure)

def figure(value, unit, higher_is_better, absolute=False):
    return {"value": round(float(value), 4), "unit": unit,
            "higher_is_better": bool(higher_is_better), "absolute": bool(absolute)}


def worse_by(base, value, higher_is_better):
    """How much worse `value` is than `base`, relative to `base` (negative: better)."""
    if base == 0:
        return 0.0 if value == base else float("inf")
    change = (value - base) / abs(base)
    return -change if higher_is_better else change


def compare(baseline, current, default_tolerance=DEFAULT_TOLERANCE):
    """Rows {name, base, value, worse_by, tolerance, status}, one per key of either side.

    status: "worse" (worse than the baseline by more than its tolerance), "better" (better
    by more than it), "ok" (within it), "missing" (in the baseline, not measured now),
    "new" (measured now, not in the baseline). The direction is the baseline's.
    """
    rows = []
    for name in sorted(set(baseline) | set(current)):
        b, c = baseline.get(name), current.get(name)
        row = {"name": name, "base": b and b["value"], "value": c and c["value"],
               "worse_by": None, "tolerance": None, "status": None}
        if b is None:
            row["status"] = "new"
        elif c is None:
            row["status"] = "missing"
        else:
            tol = b.get("tolerance", default_tolerance)
            w = worse_by(b["value"], c["value"], b["higher_is_better"])
            eps = 1e-9  # a figure exactly at the band's edge is within it despite rounding
            row.update(worse_by=w, tolerance=tol, status="worse" if w > tol + eps
                       else "better" if w < -tol - eps else "ok")
        rows.append(row)
    return rows


def regressions(rows):
    return [r["name"] for r in rows if r["status"] == "worse"]


def format_rows(rows):
    out = ["%-31s %10s %10s %9s %7s  %s" % ("figure", "baseline", "now", "worse by", "band",
                                             "status")]
    for r in rows:
        num = lambda v: "-" if v is None else "%.4g" % v
        pct = lambda v: "-" if v is None else "%+.0f%%" % (100 * v)
        status = {"worse": "WORSE", "better": "better", "ok": "ok", "new": "new (no baseline)",
                  "missing": "missing (not measured this run)"}[r["status"]]
        out.append("%-31s %10s %10s %9s %7s  %s" % (
            r["name"], num(r["base"]), num(r["value"]), pct(r["worse_by"]),
            "-" if r["tolerance"] is None else "%.0f%%" % (100 * r["tolerance"]), status))
    return "\n".join(out)


def updated_baseline(old, current, conditions):
    """The baseline file's object for `current`, keeping the old tolerances and the old
    entries of figures not measured this time."""
    figures = dict(old.get("figures", {}))
    for name, f in current.items():
        tol = figures.get(name, {}).get("tolerance", DEFAULT_TOLERANCE)
        figures[name] = dict(f, tolerance=tol)
    return {"about": "bench/quick.py (make bench-quick): the figures of a run and a relative "
                     "noise band (tolerance) per key",
            "measured": conditions, "figures": dict(sorted(figures.items()))}


# ---------------------------------------------------------------- running the benchmarks

def bench_environment():
    # OpenBLAS's kernels need nothing here: lockstep-bench gives every job and peer the
    # OPENBLAS_CORETYPE that lockstep-run would choose (docs/launcher.md, "The BLAS").
    return dict(os.environ)


class Runner:
    """Runs lockstep-bench subcommands, logs their output under `log_dir`."""

    def __init__(self, build, log_dir, env):
        self.bench = os.path.join(build, "bench", "lockstep-bench")
        self.log_dir, self.env = log_dir, env
        os.makedirs(log_dir, exist_ok=True)

    def run(self, name, args):
        """(exit status, output); the output also goes to <log_dir>/<name>.log."""
        cmd = [self.bench] + args
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=self.env, text=True, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the driver and every job it started
            out, _ = p.communicate()
            out += "\nbench/quick.py: killed after %d s\n" % STEP_TIMEOUT_S
        with open(os.path.join(self.log_dir, name + ".log"), "w") as f:
            f.write("$ " + " ".join(cmd) + "\n" + out)
        print("  %-13s %5.1f s  (exit %d; log %s)" % (name, time.monotonic() - t0, p.returncode,
                                                    os.path.join(self.log_dir, name + ".log")),
              file=sys.stderr, flush=True)
        return p.returncode, out

    def path(self, name):
        return os.path.join(self.log_dir, name)


def read_csv(path):
    try:
        with open(path, newline="") as f:
            return list(csv.reader(f))
    except OSError:
        return []


def parse_table(text, first_header):
    """The rows (dicts by header) of the lockstep-bench Table whose header starts with
    `first_header`: columns right-aligned, separated by two or more spaces."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == first_header:
            rows = []
            for body in lines[i + 2:]:  # skip the dashes
                if not body.strip():
                    break
                rows.append(dict(zip(cells, re.split(r"\s{2,}", body.strip()))))
            return rows
    return []


def collectives_times(r, name):
    """{(impl, bytes): seconds} of one short collectives run (shm beside raw OpenMPI)."""
    out = r.path(name + ".csv")
    r.run(name, ["collectives", "--nproc", "2", "--sizes", "4KiB,64MiB", "--ops", "allreduce",
                 "--impls", "shm,mpi-raw", "--out", out])
    return {(row[0], int(row[2])): float(row[4]) for row in read_csv(out) if len(row) >= 5}


def measure_collectives(r, figures, notes):
    # Three runs, the median of their ratios: one descheduled rank can make a single run's
    # 4 KiB latency several times slower (seen here under load 9).
    runs = [collectives_times(r, "collectives-%d" % k) for k in range(1, COLLECTIVES_RUNS + 1)]
    for label, size in (("4KiB", 4 << 10), ("64MiB", 64 << 20)):
        ratios = [t[("shm", size)] / t[("mpi-raw", size)] for t in runs
                  if t.get(("shm", size)) and t.get(("mpi-raw", size))]
        if ratios:
            figures["allreduce_%s_shm_over_mpi" % label] = figure(statistics.median(ratios),
                                                                  "x (time)", False)
        elif any(t.get(("shm", size)) for t in runs):
            notes.append("allreduce_%s_shm_over_mpi skipped: no OpenMPI figure (OpenMPI "
                         "missing or lockstep built without MPI)" % label)
        else:
            notes.append("allreduce_%s_shm_over_mpi: the collectives runs failed (see their "
                         "logs)" % label)


def have_torch_peer(python):
    try:
        return subprocess.run([python, "-c", "import torch.distributed"], capture_output=True,
                              env=bench_environment()).returncode == 0
    except OSError:  # no such interpreter
        return False


def measure_ddp(r, figures, notes):
    python = "/usr/bin/python3"
    if not have_torch_peer(python):
        notes.append("ddp_step_over_pytorch skipped: PyTorch DDP peer missing (%s cannot "
                     "import torch: apt-get install python3-torch, or make deps-bench)" % python)
        return
    out = r.path("ddp.csv")
    # Two rounds, lockstep and the peer interleaved (ABAB); medians over steps and rounds.
    r.run("ddp", ["ddp", "--nproc", "2", "--configs", "shm", "--steps", "4", "--warmup", "1",
                  "--rounds", "2", "--python", python, "--out", out])
    rows = read_csv(out)
    for row in rows[1:]:
        rec = dict(zip(rows[0], row))
        if rec.get("impl") == "lockstep" and float(rec["step_ratio_vs_pytorch"]) > 0:
            figures["ddp_step_over_pytorch"] = figure(rec["step_ratio_vs_pytorch"], "x (time)",
                                                      False)
            return
    notes.append("ddp_step_over_pytorch: no figure (lockstep or the peer failed; see the log)")


def measure_fsdp(r, figures, notes):
    out = r.path("fsdp.csv")
    # Two rounds (DDP and FULL_SHARD interleaved), no PyTorch peer (it needs the PyPI venv)
    # and no memory-cap search.
    r.run("fsdp", ["fsdp", "--nproc", "2", "--strategies", "ddp,full_shard", "--steps", "3",
                   "--warmup", "1", "--rounds", "2", "--skip-peer", "--skip-cap", "--out", out])
    rows = read_csv(out)
    step = {}
    for row in rows[1:]:
        rec = dict(zip(rows[0], row))
        if rec.get("impl") == "lockstep" and rec.get("step"):
            step[rec["strategy"]] = float(rec["step"])
    if step.get("ddp") and step.get("full_shard"):
        figures["fsdp_full_shard_step_over_ddp"] = figure(step["full_shard"] / step["ddp"],
                                                          "x (time)", False)
    else:
        notes.append("fsdp_full_shard_step_over_ddp: no figure (a job failed; see the log)")


def codec_row(text):
    """The 4-bit row of the codec table (best path), or None."""
    rows = [row for row in parse_table(text, "bits") if row.get("bits") == "4"]
    return rows[0] if rows else None


def measure_codec(rows, figures, notes):
    # Best of the tables: thread CPU time still slows when the other hyperthread or the
    # memory bus is busy (other builds); the best run is the closest to the codec's own speed.
    rows = [row for row in rows if row]
    if not rows:
        notes.append("qsgd4 codec figures: no codec table (see the compression logs)")
        return
    for key, col in (("qsgd4_encode_gbs_per_core", "encode GB/s"),
                     ("qsgd4_decode_add_gbs_per_core", "decode-add GB/s")):
        figures[key] = figure(max(float(row[col]) for row in rows), "GB/s", True, absolute=True)


def measure_compression(r, figures, notes):
    # 64 MiB allreduce, fp32 vs QSGD, 2 ranks on gloo over loopback shaped to 1 Gbit/s in a
    # network namespace the benchmark makes (root); the thin-link DDP step left out.
    _, text = r.run("compression", ["compression", "--nproc", "2", "--rates", "1gbit",
                                    "--skip-ddp"])
    link = [row for row in parse_table(text, "link")
            if row.get("what") == "allreduce 64MiB" and row.get("link") == "1gbit"]
    try:
        fp32, q4 = float(link[0]["fp32 ms"]), float(link[0]["4-bit ms"])
        figures["qsgd4_allreduce_speedup_1gbit"] = figure(fp32 / q4, "x (speedup)", True)
    except (IndexError, KeyError, ValueError, ZeroDivisionError):
        why = [l for l in text.splitlines() if "skipped" in l]
        notes.append("qsgd4_allreduce_speedup_1gbit skipped, lockstep-bench says: " +
                     (why[0].strip() if why else "no thin-link figure (see the log)"))
    tables = [codec_row(text)]
    for k in range(2, CODEC_RUNS + 1):
        tables.append(codec_row(r.run("codec-%d" % k, ["compression", "--skip-net"])[1]))
    measure_codec(tables, figures, notes)


# ---------------------------------------------------------------- main

def conditions():
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu,
            "cores": os.cpu_count(), "load": load}


def load_baseline(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(SOURCE, "build"), help="build directory")
    p.add_argument("--baseline", default=DEFAULT_BASELINE)
    p.add_argument("--strict", action="store_true", help="exit 1 if a figure got WORSE")
    p.add_argument("--update", action="store_true", help="write this run as the new baseline")
    p.add_argument("--save", help="also write this run's figures (JSON) to this file")
    p.add_argument("--logs", default=os.path.join("bench-results", "quick"),
                   help="folder of the subcommands' logs and CSVs")
    return p.parse_args(argv)


def measure(a):
    runner = Runner(a.build, a.logs, bench_environment())
    if not os.access(runner.bench, os.X_OK):
        sys.exit("bench/quick.py: %s not found: build it first (make build)" % runner.bench)
    figures, notes = {}, []
    for step in (measure_collectives, measure_ddp, measure_fsdp, measure_compression):
        step(runner, figures, notes)
    return figures, notes


def main(argv):
    a = parse_args(argv)
    before, t0 = conditions(), time.monotonic()
    print("bench-quick: OPENBLAS_CORETYPE=%s, load %s, %d cores" % (
        os.environ.get("OPENBLAS_CORETYPE", "(lockstep-run's choice)"), before["load"],
        before["cores"]), file=sys.stderr, flush=True)
    figures, notes = measure(a)
    cond = dict(before, load_after=conditions()["load"],
                seconds=round(time.monotonic() - t0))
    for n in notes:
        print("note: " + n)
    print(json.dumps(figures, indent=1, sort_keys=True))
    if a.save:
        with open(a.save, "w") as f:
            json.dump({"measured": cond, "figures": figures}, f, indent=1, sort_keys=True)
    old = load_baseline(a.baseline)
    rows = compare(old.get("figures", {}), figures)
    print("\ncompared with %s (measured %s):" % (
        os.path.relpath(a.baseline), old.get("measured", {}).get("date", "never")))
    print(format_rows(rows))
    worse = regressions(rows)
    print("\n%d s, load %s -> %s. %s" % (
        cond["seconds"], cond["load"], cond["load_after"],
        "WORSE than the baseline beyond its band: " + ", ".join(worse) if worse
        else "Nothing worse than the baseline beyond its band."))
    if a.update:
        with open(a.baseline, "w") as f:
            json.dump(updated_baseline(old, figures, cond), f, indent=1)
            f.write("\n")
        print("baseline written: " + a.baseline)
    return 1 if a.strict and worse else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
