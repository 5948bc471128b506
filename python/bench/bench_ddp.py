"""PyTorch DDP step time over "gloo", "lockstep" and "lockstep" + 4-bit QSGD (issue 18's
benchmark, loopback only): the MLP of `lockstep-bench ddp` (1024-4096-4096-10, ~21M
parameters), batch 64 per rank, SGD.

    torchrun --standalone --nproc-per-node 2 python/bench/bench_ddp.py [--steps 10] [--warmup 3]

Each configuration runs in the same processes, one after another; rank 0 prints the median
step time (forward, backward with DDP's overlapped allreduce, optimizer step)."""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import lockstep


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                               torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                               torch.nn.Linear(4096, 10))


def step_times(group, steps, warmup, rank):
    model = DDP(mlp(), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 1024, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    times = []
    for i in range(warmup + steps):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def allreduce_time(group, numel, reps, rank):
    x = torch.full((numel,), float(rank))
    times = []
    for i in range(reps + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lk = dist.new_group(backend="lockstep")
    numel = 16 << 20  # 64 MiB of float32
    ar = [(name, allreduce_time(g, numel, 5, rank)) for name, g in
          (("gloo", dist.group.WORLD), ("lockstep", lk))]
    rows = [("gloo", step_times(dist.group.WORLD, a.steps, a.warmup, rank))]
    rows.append(("lockstep", step_times(lk, a.steps, a.warmup, rank)))
    lockstep.compression(bits=4, bucket_size=128)
    rows.append(("lockstep + 4-bit QSGD", step_times(lk, a.steps, a.warmup, rank)))
    lockstep.compression(False)
    if rank == 0:
        for name, t in ar:
            print(f"allreduce 64 MiB float32, {world} ranks, {name:8s}: {t * 1e3:7.1f} ms "
                  f"({numel * 4 / t / 1e9:.2f} GB/s algorithm bandwidth)")
        base = rows[0][1]
        print(f"DDP step, MLP 21M, batch 64/rank, {world} ranks, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads/rank, median of {a.steps}:")
        for name, t in rows:
            print(f"  {name:24s} {t * 1e3:8.1f} ms  ({t / base:.2f}x gloo)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
