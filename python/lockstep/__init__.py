"""lockstep's collectives as a torch.distributed backend.

``import lockstep`` registers the backend "lockstep"; then::

    dist.init_process_group("lockstep")

runs every collective over lockstep's process group: shared memory when all ranks are on
one node, lockstep's gloo transport otherwise (``LOCKSTEP_BACKEND=auto|shm|gloo``).
See docs/python.md.
"""

import atexit
import datetime
import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

try:
    from . import _C
except ImportError as e:  # e.g. `import lockstep` from inside python/: the sources, unbuilt
    raise ImportError(
        f"lockstep's extension lockstep._C is missing next to {__file__}: install the package "
        "(pip install --no-build-isolation ./python) and import it from outside python/"
    ) from e

__all__ = ["BACKEND", "TRANSPORTS", "compression", "compression_options", "transport_for"]

BACKEND = "lockstep"
TRANSPORTS = ("auto", "shm", "gloo")
_ENV_TRANSPORT = "LOCKSTEP_BACKEND"
_ENV_TIMEOUT = "LOCKSTEP_TIMEOUT_S"


def _requested_transport():
    value = os.environ.get(_ENV_TRANSPORT, "auto").strip().lower() or "auto"
    if value not in TRANSPORTS:
        raise ValueError(
            f"{_ENV_TRANSPORT}={os.environ[_ENV_TRANSPORT]!r} is not a transport of the "
            f"lockstep backend; choose one of {', '.join(TRANSPORTS)}"
        )
    return value


def transport_for(store, rank, size):
    """The transport this group uses: LOCKSTEP_BACKEND, or for ``auto`` shm when every rank
    is on this node (hostnames exchanged through torch's store) and gloo otherwise."""
    requested = _requested_transport()
    if size == 1:
        return "shm" if requested == "auto" else requested
    host = socket.gethostname()
    store.set(f"lockstep/host/{rank}", host)
    hosts = [store.get(f"lockstep/host/{r}").decode() for r in range(size)]
    same_node = all(h == hosts[0] for h in hosts)
    if requested == "auto":
        return "shm" if same_node else "gloo"
    if requested == "shm" and not same_node:
        others = sorted({h for h in hosts if h != host})
        raise ValueError(
            f"{_ENV_TRANSPORT}=shm needs every rank on one node, but this group spans "
            f"{host} and {', '.join(others)}; use LOCKSTEP_BACKEND=gloo or auto"
        )
    return requested


def _create(store, rank, size, timeout):
    if isinstance(timeout, datetime.timedelta):
        timeout_s = timeout.total_seconds()
    else:
        timeout_s = float(timeout) if timeout is not None else 300.0
    if os.environ.get(_ENV_TIMEOUT) and (timeout is None or timeout == default_pg_timeout):
        timeout_s = 0.0  # torch's default, not the program's: LOCKSTEP_TIMEOUT_S applies
    transport = transport_for(store, rank, size)
    backend = _C._create(store, rank, size, timeout_s, transport)
    _live.append(backend)
    return backend


# Every backend made. At interpreter exit each one's completion thread is stopped while
# threads can still take the GIL: during finalization a thread that needs it (to drop the
# last reference to a tensor Python owns) is killed, which aborts the process. Programs
# that skip destroy_process_group(), or whose DDP module still holds the group, need this.
_live = []


@atexit.register
def _shutdown():
    for backend in _live:
        backend._lockstep_shutdown()
    _live.clear()


dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])

_COMPRESSION_DEFAULTS = dict(bits=4, bucket_size=128, min_numel=1024, stochastic=True,
                             error_feedback=False, seed=0, pipeline_chunk=1 << 20)


def compression(enabled=True, **options):
    """Compress the float allreduces (SUM/AVG of float32, bfloat16, float16 tensors of at
    least ``min_numel`` elements, e.g. DDP's gradient buckets) of every "lockstep" group of
    this process with QSGD: ``bits`` (1..8; 32 = off) per value, buckets of ``bucket_size``
    values sharing a scale, unbiased stochastic rounding (``stochastic``), optional
    ``error_feedback``; ``seed`` picks the rounding decisions; ``pipeline_chunk`` the
    pipelining rounds. Every rank must call it alike, before the allreduces it should
    apply to. The replicas' results are bit-identical. ``compression(False)`` turns it
    off. LOCKSTEP_COMPRESSION_* variables override the values passed (docs/python.md).
    """
    unknown = sorted(set(options) - set(_COMPRESSION_DEFAULTS))
    if unknown:
        hint = (" (the backend sees gradient buckets, not layer names: leave layers out with "
                "min_numel instead)" if "skip" in unknown else "")
        raise ValueError(f"lockstep.compression: unknown option(s) {', '.join(unknown)}; "
                         f"known: {', '.join(_COMPRESSION_DEFAULTS)}{hint}")
    if not enabled:
        _C._compression_off()
        return None
    merged = {**_COMPRESSION_DEFAULTS, **options}
    _C._set_compression(**merged)
    return compression_options()


def compression_options():
    """The compression in force (a dict), or None when off."""
    return _C._compression()


_C._compression_from_env()  # LOCKSTEP_COMPRESSION_BITS=4 alone turns it on

from . import hooks  # noqa: E402  (lockstep.hooks.qsgd)
