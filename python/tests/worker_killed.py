"""Rank 1 dies (os._exit) after joining; rank 0's next allreduce must raise RuntimeError
naming rank 1 well within the group's timeout, not hang. Started by the test with env://
(not torchrun, which would kill rank 0 as soon as rank 1 fails)."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import lockstep  # noqa: F401

TIMEOUT_S = 20

dist.init_process_group("lockstep", timeout=datetime.timedelta(seconds=TIMEOUT_S))
rank = dist.get_rank()
x = torch.ones(1000)
dist.all_reduce(x)
dist.barrier()
if rank == 1:
    os._exit(3)
time.sleep(0.5)
start = time.monotonic()
try:
    dist.all_reduce(x)
    print("rank 0: allreduce succeeded without rank 1")
    sys.exit(1)
except RuntimeError as e:
    took = time.monotonic() - start
    print(f"rank 0: RuntimeError after {took:.1f} s (timeout {TIMEOUT_S} s): {e}")
    sys.stdout.flush()
    os._exit(0 if took < TIMEOUT_S + 5 else 2)
