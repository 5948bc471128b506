"""PyTorch FSDP2 (fully_shard) on CPU over "lockstep" against the same over "gloo": same
model, same data, 5 Adam steps; the gathered parameters must agree within 1e-6 (float32)
and 1e-12 (float64). Prints the largest difference."""

import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import lockstep  # noqa: F401

STEPS = 5


def model(dtype):
    torch.manual_seed(0)
    # 33 and 65: sizes that do not divide by the world size (FSDP pads the shards).
    return torch.nn.Sequential(
        torch.nn.Linear(33, 65), torch.nn.ReLU(), torch.nn.Linear(65, 65), torch.nn.Tanh(),
        torch.nn.Linear(65, 10)).to(dtype)


def shard(m, group):
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def full(m):
    return [p.full_tensor().detach() for p in m.parameters()]


def run(dtype, rank, lk, gloo):
    base = model(dtype)
    a, b = shard(copy.deepcopy(base), lk), shard(copy.deepcopy(base), gloo)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (a, b)]
    g = torch.Generator().manual_seed(7 + rank)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(8, 33, generator=g).to(dtype)
        y = torch.randint(0, 10, (8,), generator=g)
        for m, opt in zip((a, b), opts):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    fa, fb = full(a), full(b)
    diff = max((p - q).abs().max().item() for p, q in zip(fa, fb))
    moved = max((p - q.detach()).abs().max().item() for p, q in zip(fa, base.parameters()))
    return diff, moved


def main():
    dist.init_process_group("lockstep")
    rank, world = dist.get_rank(), dist.get_world_size()
    lk = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    ok = True
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-12)):
        diff, moved = run(dtype, rank, lk, gloo)
        if rank == 0:
            print(f"FSDP2 lockstep vs gloo, {world} ranks, {dtype}, {STEPS} Adam steps: "
                  f"max |param difference| {diff:.3g} (parameters moved {moved:.3g})")
        ok = ok and diff <= tol and moved > 1e-3
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
