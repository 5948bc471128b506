#!/usr/bin/env python3
"""The peer of gpu_training_check --bench: PyTorch's DistributedDataParallel over Gloo on
CUDA tensors, the same workload on the same GPU in the same device run.

Model fc3(tanh(fc2(relu(fc1(x))))) with widths 16-W-W-4 (--width, default 8192), batch 256
per rank, SGD (lr 0.01), MSE loss, one warm-up step then --steps timed steps between device
synchronizations. Run with torchrun (python3 -m torch.distributed.run --standalone
--nproc-per-node 2); rank 0 prints one line "bench torch ddp step (...): X ms".
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, width), nn.Linear(width, width), nn.Linear(width, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    torch.manual_seed(9)
    model = Mlp(a.width).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(256, 16, device=dev), torch.randn(256, 4, device=dev)

    def step():
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()

    step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    s = (time.perf_counter() - t0) / a.steps
    if dist.get_rank() == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"bench torch ddp step ({n / 1e6:.0f}M params, {dist.get_world_size()} ranks, gloo, "
              f"torch {torch.__version__}): {s * 1e3:.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
