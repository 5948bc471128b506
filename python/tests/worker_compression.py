"""DDP over "lockstep" with 4-bit QSGD (lockstep.compression): the loss decreases, the
replicas' parameters stay bit-identical, and the compressed allreduce is close to the exact
one. Prints the losses and differences."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import lockstep

STEPS = 40


def main():
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    opts = lockstep.compression(bits=4, bucket_size=128, min_numel=1024)
    assert opts["bits"] == 4 and opts["min_numel"] == 1024, opts

    # One compressed allreduce against the exact sum: QSGD is unbiased, its error bounded by
    # about (max - min) / (2^bits - 1) per bucket and quantization (two quantizations).
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(100_003, generator=g)
    exact = x.clone()
    lockstep.compression(False)
    dist.all_reduce(exact)
    lockstep.compression(bits=4, bucket_size=128, min_numel=1024)
    q = x.clone()
    dist.all_reduce(q)
    err = (q - exact).abs().max().item()
    mean_err = (q - exact).mean().item()
    every = [torch.empty_like(q) for _ in range(world)]
    dist.all_gather(every, q)
    same = all(torch.equal(every[0], e) for e in every)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 4))
    ddp = DDP(model, bucket_cap_mb=0.05)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    # a learnable task: the class is the argmax of 4 fixed projections of the input
    proj = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(STEPS):
        xb = torch.randn(32, 64, generator=data)
        yb = (xb @ proj).argmax(1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    replicas_same = all(torch.equal(every[0], e) for e in every)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if rank == 0:
        print(f"4-bit QSGD allreduce of 100003 floats, {world} ranks: max |error| {err:.3g}, "
              f"mean error {mean_err:.3g}, results identical on all ranks: {same}")
        print(f"DDP + 4-bit QSGD, {world} ranks, {STEPS} steps: loss {first:.4f} -> {last:.4f} "
              f"(first/last 5 averaged); replicas bit-identical: {replicas_same}")
    ok = same and replicas_same and last < 0.8 * first and 0 < err < 1.5 and abs(mean_err) < 0.01
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
