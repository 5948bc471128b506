#!/usr/bin/python3
"""The peer of `lockstep-bench ddp`: PyTorch's own DistributedDataParallel over Gloo.

Same workload as the C++ worker (bench/ddp_worker.cpp): MLP 1024-4096-4096-10, batch 64 per
rank, SGD (lr 0.01), one compute thread per rank, synthetic data from fixed seeds.

Launched by the driver as WORLD_SIZE background processes with RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT in the environment (Debian's torchrun does not start under
Python 3.11). Run it with Debian's interpreter, /usr/bin/python3 (python3-torch).

Rank 0 prints `RESULT <key> <value>` lines (seconds), the same protocol as the C++
worker:
  step, forward, backward, optimizer   medians of the timed steps
  backward_nosync                      median backward under ddp.no_sync() (no
                                       communication): backward - backward_nosync
                                       estimates the exposed communication
  verified                             1 if every rank ends with identical parameters
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sizes", default="1024,4096,4096,10")
    ap.add_argument("--bf16", action="store_true", help="forward and loss under bf16 autocast")
    a = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in a.sizes.split(",")]

    torch.manual_seed(0)
    model = mlp(sizes)
    ddp = nn.parallel.DistributedDataParallel(model)  # defaults: 25 MB buckets, 1 MB first
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

    g = torch.Generator().manual_seed(1000 + rank)
    batches = [(torch.randn(a.batch, sizes[0], generator=g),
                torch.randint(0, sizes[-1], (a.batch,), generator=g)) for _ in range(4)]

    def step(k, times=None):
        x, y = batches[k % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = F.cross_entropy(ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if times is not None:
            times.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2))
        return loss

    for k in range(a.warmup):
        step(k)
    dist.barrier()
    times = []
    for k in range(a.steps):
        loss = step(k, times)
    ok = bool(torch.isfinite(loss).item())

    # Identical replicas: a checksum of all parameters, min == max over ranks.
    with torch.no_grad():
        s = torch.tensor([sum(float(p.double().sum()) for p in ddp.parameters())],
                         dtype=torch.float64)
    lo, hi = s.clone(), s.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    ok = ok and lo.item() == hi.item()

    # Backward without communication, same contention (every rank runs these too).
    dist.barrier()
    nosync = []
    with ddp.no_sync():
        for k in range(max(5, a.steps // 3)):
            x, y = batches[k % len(batches)]
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                loss = F.cross_entropy(ddp(x), y)
            t0 = time.perf_counter()
            loss.backward()
            nosync.append(time.perf_counter() - t0)
    dist.barrier()

    if rank == 0:
        med = lambda i: statistics.median(t[i] for t in times)
        for key, v in (("step", med(0)), ("forward", med(1)), ("backward", med(2)),
                       ("optimizer", med(3)), ("backward_nosync", statistics.median(nosync)),
                       ("verified", 1.0 if ok else 0.0)):
            print(f"RESULT {key} {v:.6f}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
