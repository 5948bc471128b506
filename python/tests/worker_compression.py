"""DDP over "lockstep" with 4-bit QSGD (lockstep.compression): the loss decreases, the
replicas' parameters stay bit-identical, and the compressed allreduce is close to the exact
one. Prints the losses and differences."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import lockstep
import training

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
    same = training.identical_on_all_ranks(q, world)

    ddp = DDP(training.mlp(), bucket_cap_mb=0.05)
    first, last = training.train(ddp, rank, STEPS)
    replicas_same = training.parameters_identical(ddp, world)
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
