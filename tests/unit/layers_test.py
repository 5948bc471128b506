#!/usr/bin/python3
"""scripts/layers.py's own test: on a copy of this tree it passes; each rule fails on a
violation planted in the copy, naming the file, the line and the include (ctest
layer_check_rules, label unit)."""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "layers.py"
COPIED = ("src", "include", "python/src", "workloads")


class LayersCheckTest(unittest.TestCase):
    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="lockstep-layers-"))
        for top in COPIED:
            shutil.copytree(ROOT / top, self.tmp / top,
                            ignore=shutil.ignore_patterns("__pycache__", "*.o"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def run_check(self):
        r = subprocess.run([sys.executable, str(SCRIPT), "--root", str(self.tmp)],
                           capture_output=True, text=True, check=False)
        return r.returncode, r.stdout + r.stderr

    def plant(self, rel, *includes):
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("// planted by layers_test.py\n" +
                        "".join(f"#include {inc}\n" for inc in includes))

    def assert_fails_naming(self, rel, line, include, rule):
        rc, out = self.run_check()
        self.assertEqual(rc, 1, out)
        hits = [l for l in out.splitlines() if l.startswith(f"{rel}:{line}:")]
        self.assertEqual(len(hits), 1, out)
        self.assertIn(include, hits[0])
        self.assertIn(rule, hits[0])
        self.assertIn("layers: 1 violation(s)", out)

    def test_the_copy_passes(self):
        rc, out = self.run_check()
        self.assertEqual((rc, out.strip()), (0, "layers: ok"))

    def test_a_backend_including_another_backend_fails(self):
        self.plant("src/comm/backends/shm/planted.cpp", '"comm/peer_watch.h"',
                   '"comm/backends/shm/shm_sync.h"', '"comm/backends/gloo/store_heartbeat.h"')
        self.assert_fails_naming("src/comm/backends/shm/planted.cpp", 4,
                                 '"comm/backends/gloo/store_heartbeat.h"',
                                 "may include comm's root (comm/*.h) and comm/backends/shm/ only")

    def test_comm_root_may_include_any_backend(self):
        self.plant("src/comm/planted.cpp", '"comm/backends/hier/hier_backend.h"',
                   '"comm/backends/shm/shm_sync.h"')
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)

    def test_python_including_a_private_header_fails(self):
        self.plant("python/src/planted.cpp", "<lockstep/comm/make_group.h>", '"backend.h"',
                   "<torch/csrc/distributed/c10d/Store.hpp>", '"comm/backend_factories.h"')
        self.assert_fails_naming("python/src/planted.cpp", 5, '"comm/backend_factories.h"',
                                 "python/ may include lockstep's public headers")

    def test_a_layer_including_a_layer_above_still_fails(self):
        self.plant("src/comm/planted.cpp", "<lockstep/parallel/ddp/ddp.h>")
        self.assert_fails_naming("src/comm/planted.cpp", 2, "<lockstep/parallel/ddp/ddp.h>",
                                 "layer 'comm' may include only")

    def plant_text(self, rel, text):
        path = self.tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("// planted by layers_test.py\n" + text)

    def test_defining_in_another_layers_namespace_fails(self):
        self.plant_text("src/parallel/ddp/hooks/planted.cpp",
                        "namespace lockstep::ddp::hooks {\nvoid fine() {}\n}\n"
                        "namespace lockstep::compress {  // a { in a comment\n"
                        "const char* s = \"namespace x {\";\nvoid wrong() {}\n}\n")
        self.assert_fails_naming("src/parallel/ddp/hooks/planted.cpp", 5,
                                 "namespace lockstep::compress", "defines in lockstep::ddp")

    def test_declaring_in_another_namespace_passes(self):
        self.plant_text("include/lockstep/numerics/planted.h",
                        "namespace lockstep::comm {\nclass ProcessGroup;\n}\n"
                        "namespace lockstep {\nusing numerics::Autocast;\n}\n"
                        "namespace lockstep::numerics {\nnamespace {\nint x() { return 1; }\n}\n}\n")
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    unittest.main()
