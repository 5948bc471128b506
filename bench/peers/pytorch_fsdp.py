#!/usr/bin/env python3
"""The peer of `lockstep-bench fsdp`: PyTorch's own FSDP (fully_shard, "FSDP2") on CPU over Gloo.

Same workload as the C++ worker (bench/fsdp_worker.cpp, bench/fsdp_model.cpp): the same
transformer with the same parameter names and values (set from integer hashes of the names,
no random generator), the same token batches, fp32 AdamW (lr 1e-5, weight decay 0.01), one
compute thread per rank. Needs torch 2.x: Debian's python3-torch 1.13 cannot import FSDP
under Python 3.11. `scripts/install-deps.sh --bench` creates <source>/.venv-bench with it;
run this with .venv-bench/bin/python.

Launched by the driver as WORLD_SIZE background processes with RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT in the environment. --strategy:
  full_shard      fully_shard(block) for every block, then fully_shard(model) (reshard after
                  forward: ZeRO-3)
  shard_grad_op   the same with reshard_after_forward=False (ZeRO-2-like)
  ddp             torch.nn.parallel.DistributedDataParallel (also the fallback, announced by
                  "RESULT fallback_ddp 1", when fully_shard cannot run here)
--check-grads: instead of timing, one step's gradients against a single-process reference on
the concatenated batch of all ranks (FSDP2 over Gloo summed gradients instead of averaging
them before about torch 2.11, pytorch#162338); prints "RESULT grad_rel_diff x" (max |fsdp -
reference| / max |reference|) and "RESULT grad_scale s" (the least-squares ratio fsdp /
reference: 1 when averaged, WORLD_SIZE when summed).

Rank 0 prints `RESULT <key> <value>` lines, the protocol of the C++ worker: step, forward,
backward, optimizer (medians, seconds), loss_first, loss_last, param_sum, rss_base,
rss_peak, state_end (bytes; the maximum over ranks), verified, completed.
"""
import argparse
import os
import resource
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def fnv1a(s):
    h = 2166136261
    for c in s.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return h


def hash_uniform(n, seed):
    idx = torch.arange(n, dtype=torch.long)
    return (idx * 2654435761 + seed).remainder(4294967296).double() / 4294967296.0


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.heads = heads

    def attention(self, x):
        B, T, d = x.shape
        dh = d // self.heads
        q, k, v = (t.view(B, T, self.heads, dh).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / dh ** 0.5)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = F.softmax(att.masked_fill(future, float("-inf")), -1)
        return self.proj(torch.matmul(att, v).transpose(1, 2).reshape(B, T, d))

    def forward(self, x):
        h = x + self.attention(self.ln1(x))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class TransformerLM(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.d_model)
        self.pos = nn.Parameter(torch.zeros(a.seq, a.d_model))
        self.names = [f"block{i}" for i in range(a.layers)]
        for n in self.names:
            setattr(self, n, Block(a.d_model, max(1, a.d_model // 64)))
        self.ln_f = nn.LayerNorm(a.d_model)
        self.head = nn.Linear(a.d_model, a.vocab, bias=False)

    def blocks(self):
        return [getattr(self, n) for n in self.names]

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for b in self.blocks():
            x = b(x)
        return self.head(self.ln_f(x)).view(-1, self.head.out_features)


@torch.no_grad()
def init_deterministic(model):
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.fill_(1.0 if name.endswith("weight") else 0.0)
            continue
        embedding = name == "pos" or name.startswith("tok.")
        bound = 0.05 if embedding else 1.0 / p.shape[1] ** 0.5
        u = hash_uniform(p.numel(), fnv1a(name))
        p.copy_(((u * 2 - 1) * bound).to(p.dtype).view(p.shape))


def make_batch(a, rank, k):
    n = a.batch * (a.seq + 1)
    seed = 7919 * (rank + 1) + 104729 * (k % 4)
    h = (torch.arange(n, dtype=torch.long) * 2654435761 + seed).remainder(4294967296)
    ids = torch.div(h, 256, rounding_mode="floor").remainder(a.vocab).view(a.batch, a.seq + 1)
    return ids[:, : a.seq].contiguous(), ids[:, 1:].reshape(-1)


def build_model(a):
    model = TransformerLM(a)
    init_deterministic(model)
    return model


def shard(model, a):
    """The parallel model for --strategy, and the strategy that actually runs."""
    if a.strategy != "ddp":
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            reshard = a.strategy == "full_shard"
            for b in model.blocks():
                fully_shard(b, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
            return model, a.strategy
        except Exception as e:  # the error, then DDP as the peer
            print(f"fully_shard does not run here: {type(e).__name__}: {e}; falling back to DDP",
                  file=sys.stderr, flush=True)
    return nn.parallel.DistributedDataParallel(model), "ddp"


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def storage_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        s = local(t).untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def model_state_bytes(model, opt):
    ts = []
    for p in model.parameters():
        ts += [p, p.grad]
    for st in opt.state.values():
        ts += [v for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    return storage_bytes(ts)


def vm_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def reduce(v, op):
    t = torch.tensor([float(v)], dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.item()


def report(rank, key, value):
    if rank == 0:
        print(f"RESULT {key} {value:.9g}", flush=True)


def check_grads(a, model, rank, world):
    """One step's gradients against one process on the concatenated batch of all ranks."""
    ref = build_model(a)
    par, _ = shard(model, a)
    x, y = make_batch(a, rank, 0)
    F.cross_entropy(par(x), y).backward()
    xs, ys = zip(*(make_batch(a, r, 0) for r in range(world)))
    F.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
    ref_grads = dict(ref.named_parameters())
    num = den = dot = sq = 0.0
    for name, p in par.named_parameters():
        name = name.removeprefix("module.")
        g, r = full(p.grad).double(), ref_grads[name].grad.double()
        num, den = max(num, (g - r).abs().max().item()), max(den, r.abs().max().item())
        dot, sq = dot + (g * r).sum().item(), sq + (r * r).sum().item()
    report(rank, "grad_rel_diff", num / den)
    report(rank, "grad_scale", dot / sq)
    report(rank, "completed", 1.0)


def train(a, par, opt, rank):
    batches = [make_batch(a, rank, k) for k in range(4)]
    times, losses = [], []
    for k in range(a.warmup + a.steps):
        x, y = batches[k % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(par(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if k >= a.warmup:
            times.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2))
        if k + 1 == a.warmup:
            dist.barrier()
    return times, losses


def param_sum(par, strategy):
    s = sum(float(local(p).detach().double().sum()) for p in par.parameters())
    if strategy == "ddp":
        same = reduce(s, dist.ReduceOp.MAX) == -reduce(-s, dist.ReduceOp.MAX)
        return s, same
    return reduce(s, dist.ReduceOp.SUM), True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="full_shard",
                    choices=["full_shard", "shard_grad_op", "ddp"])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--check-grads", action="store_true")
    a = ap.parse_args()

    # The root returns logits.view(...): FSDP2 warns that an in-place op on that view would
    # skip its hook; the loss does none.
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rss_base = vm_rss()
    model = build_model(a)
    if a.check_grads:
        check_grads(a, model, rank, world)
        dist.destroy_process_group()
        return 0
    par, strategy = shard(model, a)
    report(rank, "fallback_ddp", 1.0 if strategy != a.strategy else 0.0)
    opt = torch.optim.AdamW(par.parameters(), lr=1e-5, weight_decay=0.01)
    times, losses = train(a, par, opt, rank)
    total, same = param_sum(par, strategy)
    state_end = model_state_bytes(par, opt)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    med = lambda i: statistics.median(t[i] for t in times)
    for key, v in (("step", med(0)), ("forward", med(1)), ("backward", med(2)),
                   ("optimizer", med(3)), ("loss_first", losses[0]), ("loss_last", losses[-1]),
                   ("param_sum", total)):
        report(rank, key, v)
    for key, v in (("rss_base", rss_base), ("rss_peak", rss_peak), ("state_end", state_end)):
        report(rank, key, reduce(v, dist.ReduceOp.MAX))
    ok = same and all(map(lambda l: l == l and abs(l) != float("inf"), losses))
    report(rank, "verified", 1.0 if ok else 0.0)
    dist.barrier()
    report(rank, "completed", 1.0)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
