"""PyTorch DDP over "lockstep" (the default group) against DDP over "gloo" (a second group
of the same ranks): same model, same data, 10 SGD steps; the parameters must agree within
1e-6. Prints the largest difference."""

import copy
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import lockstep  # noqa: F401

STEPS = 10
TOL = 1e-6


def model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 10)).to(dtype)


def run(dtype, rank, gloo):
    base = model(dtype)
    # bucket_cap_mb small: several buckets, so DDP's overlap of backward and allreduce runs.
    ddp_lk = DDP(copy.deepcopy(base), bucket_cap_mb=0.01)
    ddp_gl = DDP(copy.deepcopy(base), process_group=gloo, bucket_cap_mb=0.01)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ddp_lk, ddp_gl)]
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=g).to(dtype)
        y = torch.randint(0, 10, (16,), generator=g)
        for m, opt in zip((ddp_lk, ddp_gl), opts):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    diff = max((p.detach() - q.detach()).abs().max().item()
               for p, q in zip(ddp_lk.parameters(), ddp_gl.parameters()))
    moved = max((p.detach() - q.detach()).abs().max().item()
                for p, q in zip(ddp_lk.parameters(), base.parameters()))
    # the lockstep replicas are bit-identical across ranks
    flat = torch.cat([p.detach().reshape(-1) for p in ddp_lk.parameters()])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat, group=gloo)
    assert all(torch.equal(every[0], f) for f in every), "replicas differ"
    return diff, moved


def main():
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    ok = True
    for dtype in (torch.float32, torch.float64):
        diff, moved = run(dtype, rank, gloo)
        if rank == 0:
            print(f"DDP lockstep vs gloo, {world} ranks, {dtype}, {STEPS} steps: "
                  f"max |param difference| {diff:.3g} (parameters moved {moved:.3g})")
        ok = ok and diff <= TOL and moved > 1e-3
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
