"""Every collective of the "lockstep" backend against "gloo" on the same inputs.

The default group is gloo; a second group over the same ranks uses lockstep. Each rank
checks its own results and prints the largest difference per dtype; any mismatch raises.
"""

import sys

import torch
import torch.distributed as dist

import lockstep  # noqa: F401  (registers the backend)

SIZES = [0, 1, 7, 1001, (1 << 20) + 3]  # empty, one, odd, odd > a cache line, large
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64]


def make(numel, dtype, rank, salt):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return (torch.randn(numel, generator=g, dtype=torch.float64) * 10).to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=g, dtype=dtype)


def close(name, got, want, worst):
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{name}: got {got.dtype}{tuple(got.shape)}, "
                             f"want {want.dtype}{tuple(want.shape)}")
    if got.numel():
        diff = (got.double() - want.double()).abs().max().item()
        worst[got.dtype] = max(worst.get(got.dtype, 0.0), diff)
    # Exact for integers; for floats the tolerances of torch.testing, as the two backends
    # may sum in another order or precision. bfloat16 (8 bits of mantissa, values ~10-40):
    # one rounding step apart (an ulp of the partial sum, <= 0.25) even where the sum cancels.
    kw = {"atol": 0.25, "rtol": 1.6e-2} if got.dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}", **kw)


def check_all(lk, rank, world):
    worst = {}
    for numel in SIZES:
        for dtype in DTYPES:
            tag = f"{dtype} n={numel}"
            x = make(numel, dtype, rank, numel)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=op, group=lk)
                dist.all_reduce(b, op=op)
                close(f"all_reduce {op} {tag}", a, b, worst)
            if dtype.is_floating_point:
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=dist.ReduceOp.AVG, group=lk)
                dist.all_reduce(b)  # gloo has no AVG: sum, then divide
                close(f"all_reduce AVG {tag}", a, b / world, worst)
            # broadcast from the last rank
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src=world - 1, group=lk)
            dist.broadcast(b, src=world - 1)
            close(f"broadcast {tag}", a, b, worst)
            # all_gather (list) and all_gather_into_tensor (flat)
            la = [torch.empty_like(x) for _ in range(world)]
            lb = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(la, x, group=lk)
            dist.all_gather(lb, x)
            for r in range(world):
                close(f"all_gather[{r}] {tag}", la[r], lb[r], worst)
            fa = torch.empty(world * numel, dtype=dtype)
            fb = torch.empty(world * numel, dtype=dtype)
            dist.all_gather_into_tensor(fa, x, group=lk)
            dist.all_gather_into_tensor(fb, x)
            close(f"all_gather_into_tensor {tag}", fa, fb, worst)
            # reduce_scatter (list and flat): reference = gloo allreduce of the whole input
            big = make(world * numel, dtype, rank, numel + 1)
            ref = big.clone()
            dist.all_reduce(ref)
            want = ref[rank * numel:(rank + 1) * numel]
            out = torch.empty(numel, dtype=dtype)
            dist.reduce_scatter_tensor(out, big, group=lk)
            close(f"reduce_scatter_tensor {tag}", out, want, worst)
            out = torch.empty(numel, dtype=dtype)
            dist.reduce_scatter(out, list(big.chunk(world)) if numel else
                                [torch.empty(0, dtype=dtype)] * world, group=lk)
            close(f"reduce_scatter {tag}", out, want, worst)
            # all_to_all_single, equal splits
            a = torch.empty(world * numel, dtype=dtype)
            b = torch.empty(world * numel, dtype=dtype)
            dist.all_to_all_single(a, big, group=lk)
            dist.all_to_all_single(b, big)
            close(f"all_to_all_single {tag}", a, b, worst)
    return worst


def check_misc(lk, rank, world):
    # A non-contiguous tensor (staged through a contiguous copy and written back).
    m = make(6 * 5, torch.float32, rank, 7).view(6, 5).t()
    a, b = m.clone(), m.clone()  # clone keeps the transposed strides
    assert not a.is_contiguous()
    dist.all_reduce(a, group=lk)
    dist.all_reduce(b)
    torch.testing.assert_close(a, b)
    # send/recv around the ring
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    t = torch.full((13,), float(rank), dtype=torch.float64)
    got = torch.empty(13, dtype=torch.float64)
    if rank % 2 == 0:
        dist.send(t, dst=lk_global(nxt), group=lk)
        dist.recv(got, src=lk_global(prv), group=lk)
    else:
        dist.recv(got, src=lk_global(prv), group=lk)
        dist.send(t, dst=lk_global(nxt), group=lk)
    assert torch.equal(got, torch.full((13,), float(prv), dtype=torch.float64)), got
    # async work: wait(), is_completed() and the future's value
    x = torch.ones(1000)
    w = dist.all_reduce(x, group=lk, async_op=True)
    fut = w.get_future()
    w.wait()
    assert w.is_completed()
    assert torch.equal(fut.wait()[0], torch.full((1000,), float(world)))
    dist.barrier(group=lk)


def lk_global(r):
    return r  # the lockstep group spans every rank, in order


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lk = dist.new_group(backend="lockstep")
    worst = check_all(lk, rank, world)
    check_misc(lk, rank, world)
    if rank == 0:
        for dtype, d in worst.items():
            print(f"lockstep vs gloo, {world} ranks: max |difference| {dtype}: {d:.3g}")
        print(f"collectives OK on {world} ranks")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
