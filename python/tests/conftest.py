"""Helpers: run a worker script under torchrun and fail with its output."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def torchrun(script, nproc, *args, env=None, timeout=240):
    """Runs tests/<script> on `nproc` ranks of one node; returns (returncode, output)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc}", str(HERE / script), *map(str, args),
    ]
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.update(env or {})
    try:
        p = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{script} on {nproc} ranks hung (> {timeout} s):\n{out}")
    return p.returncode, p.stdout


@pytest.fixture
def run_ok():
    def run(script, nproc, *args, **kw):
        rc, out = torchrun(script, nproc, *args, **kw)
        print(out)
        assert rc == 0, f"{script} on {nproc} ranks failed (rc {rc}):\n{out}"
        return out
    return run
