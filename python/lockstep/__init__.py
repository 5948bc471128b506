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
import weakref

import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND", "TRANSPORTS", "transport_for"]

BACKEND = "lockstep"
TRANSPORTS = ("auto", "shm", "gloo")
_ENV_TRANSPORT = "LOCKSTEP_BACKEND"


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
    transport = transport_for(store, rank, size)
    backend = _C._create(store, rank, size, timeout_s, transport)
    _live.add(backend)
    return backend


# The backends alive now. A program may leave without destroy_process_group(); its groups
# are then torn down at interpreter exit, while threads can still be joined (C++ static
# destruction would find lockstep's comm and completion threads still running and abort).
_live = weakref.WeakSet()


@atexit.register
def _shutdown():
    if len(_live) and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
