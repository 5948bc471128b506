"""The "lockstep" torch.distributed backend under torchrun (docs/python.md)."""

import os
import subprocess
import sys
import time

import pytest

from conftest import torchrun


@pytest.mark.parametrize("nproc", [2, 3])
def test_collectives_match_gloo(run_ok, nproc):
    out = run_ok("worker_collectives.py", nproc)
    assert f"collectives OK on {nproc} ranks" in out


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_ddp_matches_gloo(run_ok, transport):
    out = run_ok("worker_ddp.py", 2, env={"LOCKSTEP_BACKEND": transport})
    assert out.count("max |param difference|") == 2


def test_exit_without_destroy_does_not_hang():
    start = time.monotonic()
    rc, out = torchrun("worker_exit.py", 2, timeout=60)
    print(out, f"exit took {time.monotonic() - start:.1f} s")
    assert rc == 0, out
    assert out.count("leaving without destroy_process_group") == 2


SINGLE = """
import torch, torch.distributed as dist, lockstep
dist.init_process_group("lockstep", store=dist.HashStore(), rank=0, world_size=1)
"""


def python(code, env, tmp_path):
    full = dict(os.environ)
    full.update(env)
    # not from python/: `import lockstep` must find the installed package, not the sources
    return subprocess.run([sys.executable, "-c", code], env=full, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60, cwd=tmp_path)


def test_unknown_transport_raises_value_error_naming_it(tmp_path):
    p = python(SINGLE, {"LOCKSTEP_BACKEND": "carrier-pigeon"}, tmp_path)
    assert p.returncode != 0
    assert "ValueError" in p.stdout and "carrier-pigeon" in p.stdout, p.stdout
    assert "LOCKSTEP_BACKEND" in p.stdout


def test_unsupported_reduce_op_is_refused(tmp_path):
    code = SINGLE + "dist.all_reduce(torch.ones(3), op=dist.ReduceOp.PRODUCT)\n"
    p = python(code, {"LOCKSTEP_BACKEND": "gloo"}, tmp_path)
    assert p.returncode != 0
    assert "reduce op not supported" in p.stdout, p.stdout


def test_fsdp2_matches_gloo(run_ok):
    out = run_ok("worker_fsdp.py", 2)
    assert out.count("max |param difference|") == 2


@pytest.mark.parametrize("nproc", [2, 3])
def test_ddp_with_4bit_qsgd_learns_and_replicas_agree(run_ok, nproc):
    out = run_ok("worker_compression.py", nproc)
    assert "replicas bit-identical: True" in out


def test_unknown_compression_option_raises_value_error_naming_it(tmp_path):
    p = python("import lockstep; lockstep.compression(bits=4, bucketsize=64)", {}, tmp_path)
    assert p.returncode != 0
    assert "ValueError" in p.stdout and "bucketsize" in p.stdout, p.stdout


def test_bad_compression_env_raises_value_error_naming_it(tmp_path):
    p = python("import lockstep", {"LOCKSTEP_COMPRESSION_BITS": "five"}, tmp_path)
    assert p.returncode != 0
    assert "ValueError" in p.stdout and "LOCKSTEP_COMPRESSION_BITS" in p.stdout, p.stdout


def test_bad_compression_value_raises_value_error(tmp_path):
    p = python("import lockstep; lockstep.compression(bits=9)", {}, tmp_path)
    assert p.returncode != 0
    assert "ValueError" in p.stdout and "bits" in p.stdout, p.stdout
