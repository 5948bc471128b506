"""What the DDP workers share: the small model, its learnable task, and the replica check."""

import torch
import torch.distributed as dist


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 4))


def train(ddp, rank, steps):
    """SGD steps on a learnable task (the class is the argmax of 4 fixed projections of the
    input); returns the mean loss of the first 5 and of the last 5 steps."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    proj = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(steps):
        xb = torch.randn(32, 64, generator=data)
        yb = (xb @ proj).argmax(1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[:5]) / 5, sum(losses[-5:]) / 5


def identical_on_all_ranks(t, world, group=None):
    """True if every rank holds the same bits in t."""
    every = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(every, t, group=group)
    return all(torch.equal(every[0], e) for e in every)


def parameters_identical(ddp, world, group=None):
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    return identical_on_all_ranks(flat, world, group)
