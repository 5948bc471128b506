"""The "lockstep" torch.distributed backend under torchrun (docs/python.md)."""

import os
import subprocess
import sys
import time
from pathlib import Path

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


# The group is built by lockstep's make_group, which reads lockstep's settings as init() does.
@pytest.mark.parametrize("var", ["LOCKSTEP_TIMEOUT_S", "LOCKSTEP_CHECK_COLLECTIVES",
                                 "LOCKSTEP_STALL_WARN_S"])
def test_bad_lockstep_setting_raises_naming_it(tmp_path, var):
    p = python(SINGLE, {var: "abc", "LOCKSTEP_BACKEND": "shm"}, tmp_path)
    assert p.returncode != 0
    assert f"{var}='abc'" in p.stdout, p.stdout


def test_lockstep_timeout_applies_when_the_program_gives_none(tmp_path):
    code = SINGLE + "print('timeout', lockstep._live[0]._lockstep_timeout_s)\n"
    p = python(code, {"LOCKSTEP_TIMEOUT_S": "2.5", "LOCKSTEP_BACKEND": "shm"}, tmp_path)
    assert p.returncode == 0, p.stdout
    assert "timeout 2.5" in p.stdout, p.stdout


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


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_killed_rank_raises_runtime_error_naming_it(tmp_path, transport):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   LOCKSTEP_BACKEND=transport, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).parent / "worker_killed.py")], env=env,
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        out0, _ = procs[0].communicate(timeout=90)
        procs[1].communicate(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print(out0)
    assert procs[1].returncode == 3
    assert procs[0].returncode == 0, out0
    assert "RuntimeError" in out0 and "rank 1" in out0, out0


@pytest.mark.parametrize("nproc", [2, 3])
def test_qsgd_hook_over_gloo_and_lockstep(run_ok, nproc):
    out = run_ok("worker_hook.py", nproc)
    assert out.count("replicas bit-identical: True") == 2
