#!/usr/bin/python3
"""bench/quick.py's comparison with its baseline, on the fixed figures of
tests/unit/bench_quick/ (no benchmark runs): ctest bench_quick_compare, label unit."""
import contextlib
import copy
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import quick  # noqa: E402  bench/quick.py

FIXTURES = os.path.join(HERE, "bench_quick")


def load(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


class CompareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rows = quick.compare(load("baseline.json")["figures"], load("current.json"))
        cls.rows = {r["name"]: r for r in rows}
        print("the fixture's comparison:\n" + quick.format_rows(rows))

    def check(self, name, status, worse_by):
        r = self.rows[name]
        self.assertEqual(r["status"], status, name)
        if worse_by is None:
            self.assertIsNone(r["worse_by"])
        else:  # relative change, exact up to float rounding
            self.assertAlmostEqual(r["worse_by"], worse_by, places=9, msg=name)

    def test_better_lower_is_better(self):  # 0.8 -> 0.7 time ratio, band 10%
        self.check("allreduce_64MiB_shm_over_mpi", "better", -0.1 / 0.8)

    def test_worse_within_band_higher_is_better(self):  # 9 -> 8 GB/s, band 15%
        self.check("qsgd4_encode_gbs_per_core", "ok", 1 / 9)

    def test_worse_outside_band_higher_is_better(self):  # 7x -> 5x speedup, band 20%
        self.check("qsgd4_allreduce_speedup_1gbit", "worse", 2 / 7)

    def test_lower_is_better_within_and_outside_band(self):
        self.check("fsdp_full_shard_step_over_ddp", "ok", 0.2 / 1.2)  # band 25%
        self.check("ddp_step_over_pytorch", "worse", 0.2 / 0.6)      # band 20%

    def test_missing_and_new_keys(self):
        self.check("allreduce_4KiB_shm_over_mpi", "missing", None)
        self.check("qsgd4_decode_add_gbs_per_core", "new", None)

    def test_regressions_are_the_worse_ones_only(self):
        self.assertEqual(
            sorted(quick.regressions(list(self.rows.values()))),
            ["ddp_step_over_pytorch", "qsgd4_allreduce_speedup_1gbit"])

    def test_better_higher_is_better_and_edges(self):
        base = {"x": quick.figure(10, "GB/s", True), "y": quick.figure(1, "x", False)}
        base["x"]["tolerance"] = 0.1
        base["y"]["tolerance"] = 0.1
        now = {"x": quick.figure(12, "GB/s", True), "y": quick.figure(1.1, "x", False)}
        rows = {r["name"]: r for r in quick.compare(base, now)}
        self.assertEqual(rows["x"]["status"], "better")
        self.assertAlmostEqual(rows["x"]["worse_by"], -0.2)
        # exactly at the band is still "ok": only beyond it is flagged
        self.assertAlmostEqual(rows["y"]["worse_by"], 0.1)
        self.assertEqual(rows["y"]["status"], "ok")


class MainTest(unittest.TestCase):
    """main() with the benchmark runs replaced by the fixture's figures."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.baseline = os.path.join(self.tmp, "baseline.json")
        shutil.copy(os.path.join(FIXTURES, "baseline.json"), self.baseline)
        self.saved = quick.measure
        quick.measure = lambda a: (load("current.json"), ["a note"])

    def tearDown(self):
        quick.measure = self.saved
        shutil.rmtree(self.tmp)

    def main(self, *args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = quick.main(["--baseline", self.baseline] + list(args))
        return status, out.getvalue()

    def test_exit_status_nonzero_only_with_strict(self):
        status, out = self.main()
        self.assertEqual(status, 0)
        self.assertIn("WORSE than the baseline beyond its band: ddp_step_over_pytorch, "
                      "qsgd4_allreduce_speedup_1gbit", out)
        status, _ = self.main("--strict")
        self.assertEqual(status, 1)

    def test_prints_the_figures_as_one_json_object(self):
        _, out = self.main()
        start = out.index("{")
        figures, _ = json.JSONDecoder().raw_decode(out[start:])
        self.assertEqual(figures, load("current.json"))

    def test_update_keeps_bands_and_unmeasured_entries(self):
        old = load("baseline.json")["figures"]
        self.main("--update")
        with open(self.baseline) as f:
            new = json.load(f)["figures"]
        for name, f in load("current.json").items():
            want = copy.deepcopy(f)
            want["tolerance"] = old.get(name, {}).get("tolerance", quick.DEFAULT_TOLERANCE)
            self.assertEqual(new[name], want, name)
        # not measured this run: the old entry stays
        self.assertEqual(new["allreduce_4KiB_shm_over_mpi"], old["allreduce_4KiB_shm_over_mpi"])
        status, out = self.main("--strict")  # the run now equals its baseline
        self.assertEqual(status, 0)
        self.assertIn("Nothing worse", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
