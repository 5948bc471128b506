#!/usr/bin/env python3
"""PyTorch's own PowerSGD hook on fixed gradients: the reference powersgd_check compares to.

Usage: powersgd_torch_ref.py OUT_DIR

Runs torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook over 2 gloo
processes (init_method file://) for each case of CASES, calling it as DDP does: per step,
each bucket in index order (the last one is_last), each bucket's future waited before the
next bucket. Per case it writes, as raw little-endian float64:
  <case>.inputs.bin    [rank][step][bucket elements]  each rank's raw gradients
  <case>.outputs.bin   [step][bucket elements]        rank 0's averaged result
  <case>.errors.bin    [rank][bucket elements]        each rank's final error (raw units)
The bucket elements are every bucket's buffer, bucket 0 first. The shapes and options
must match powersgd_check.cpp's copy of CASES.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

# Buckets of parameter shapes; the same in powersgd_check.cpp.
BUCKETS = [
    [(16, 24), (24,), (8, 4, 3), (10,), (40, 6)],
    [(12, 12), (7, 5), (12, 12), (3,)],
]
# name, dtype, rank, start_iter, error feedback, warm start, min_compression_rate, seed, steps
CASES = [
    ("gs_warm_f64", torch.float64, 2, 2, True, True, 2.0, 0, 6),
    ("qr_cold_f32", torch.float32, 4, 2, True, False, 2.0, 7, 5),
    ("rank1_rate1_f64", torch.float64, 1, 3, True, True, 0.5, 123, 6),
]
WORLD = 2


class Bucket:
    """What powerSGD_hook reads of a dist.GradBucket."""

    def __init__(self, index, is_last, buffer, shapes):
        self._index, self._is_last, self._buffer, self._shapes = index, is_last, buffer, shapes

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def is_last(self):
        return self._is_last

    def gradients(self):
        out, at = [], 0
        for s in self._shapes:
            n = 1
            for d in s:
                n *= d
            out.append(self._buffer[at:at + n].view(s))
            at += n
        return out


def numel(shapes):
    total = 0
    for s in shapes:
        n = 1
        for d in s:
            n *= d
        total += n
    return total


def inputs(case_index, rank, step, dtype):
    """Each rank's raw gradients of one step, drawn from a seeded generator."""
    g = torch.Generator().manual_seed(1000 * case_index + 100 * rank + step)
    sizes = [numel(b) for b in BUCKETS]
    flat = torch.randn(sum(sizes), generator=g, dtype=torch.float64)
    return flat.to(dtype)


def worker(rank, init_file, out_dir):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=WORLD)
    sizes = [numel(b) for b in BUCKETS]
    for ci, (name, dtype, r, start, ef, warm, rate, seed, steps) in enumerate(CASES):
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r,
                                   start_powerSGD_iter=start, min_compression_rate=rate,
                                   use_error_feedback=ef, warm_start=warm, random_seed=seed)
        ins, outs = [], []
        for step in range(steps):
            x = inputs(ci, rank, step, dtype)
            ins.append(x.clone())
            results, at = [], 0
            for bi, shapes in enumerate(BUCKETS):
                buf = x[at:at + sizes[bi]].clone()
                at += sizes[bi]
                b = Bucket(bi, bi == len(BUCKETS) - 1, buf, shapes)
                results.append(psgd.powerSGD_hook(state, b).wait().clone())
            outs.append(torch.cat(results))
        errors = torch.cat([state.error_dict[bi] for bi in range(len(BUCKETS))])
        all_in = [torch.zeros(steps * sum(sizes), dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(all_in, torch.cat(ins))
        all_err = [torch.zeros(sum(sizes), dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(all_err, errors)
        if rank == 0:
            def write(suffix, t):
                t.to(torch.float64).contiguous().numpy().tofile(
                    os.path.join(out_dir, name + suffix))
            write(".inputs.bin", torch.cat(all_in))
            write(".outputs.bin", torch.cat(outs))
            write(".errors.bin", torch.cat(all_err))
    dist.destroy_process_group()


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    fd, init_file = tempfile.mkstemp(prefix="powersgd_ref_")
    os.close(fd)
    os.unlink(init_file)  # FileStore creates it
    try:
        mp.spawn(worker, args=(init_file, out_dir), nprocs=WORLD, join=True)
    finally:
        if os.path.exists(init_file):
            os.unlink(init_file)
    print("powersgd_torch_ref: torch %s, %d cases written to %s" % (torch.__version__, len(CASES),
                                                                    out_dir))


if __name__ == "__main__":
    main()
