"""Leaves the interpreter with the lockstep group still alive (no destroy_process_group),
after async work whose handle is dropped: the process must exit promptly."""

import torch
import torch.distributed as dist

import lockstep  # noqa: F401

dist.init_process_group("lockstep")
x = torch.ones(1 << 16)
dist.all_reduce(x)
dist.all_reduce(x, async_op=True)  # handle dropped
assert dist.get_backend() == "lockstep"
print(f"rank {dist.get_rank()} leaving without destroy_process_group")
