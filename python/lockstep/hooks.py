"""DDP communication hooks that work over any torch.distributed backend.

``qsgd(...)`` returns ``(state, hook)`` for ``ddp.register_comm_hook(state, hook)``: every
gradient bucket of at least ``min_numel`` elements (and none of whose parameters ``skip``
names) is averaged with QSGD, in the scheme of lockstep's compressed allreduce
(docs/compression.md): each rank quantizes the parts of the bucket other ranks own, an
all_to_all_single delivers them, each owner sums the decoded copies with its own exact
values, quantizes the mean once more, and an all_gather hands every rank the same bytes,
which every rank decodes alike, so the replicas stay bit-identical. Codes travel one per
byte (uint8) with a float32 (min, step) per bucket of ``bucket_size`` values: 1/4 of the
float32 bytes at 4 bits plus 8 bytes per bucket (lockstep's C++ codec packs the bits; this
pure-torch one does not). Smaller or skipped buckets go in a plain allreduce.

The hook runs its collectives synchronously when DDP hands it a bucket (no overlap with
the rest of the backward), and returns a completed future.
"""

import torch
import torch.distributed as dist

__all__ = ["QsgdState", "qsgd"]


class QsgdState:
    def __init__(self, process_group, bits, bucket_size, min_numel, skip, names, seed):
        self.process_group = process_group
        self.bits = bits
        self.bucket_size = bucket_size
        self.min_numel = min_numel
        self.skip = skip
        self.names = names  # id(parameter) -> name
        self.seed = seed
        self.step = 0


def qsgd(model=None, process_group=None, bits=4, bucket_size=128, min_numel=1024, skip=None,
         seed=0, **unknown):
    """(state, hook) for ``ddp.register_comm_hook``. ``model``: the module DDP wraps (its
    parameter names are what ``skip(name) -> bool`` sees)."""
    if unknown:
        raise ValueError(f"lockstep.hooks.qsgd: unknown option(s) {', '.join(sorted(unknown))}; "
                         "known: model, process_group, bits, bucket_size, min_numel, skip, seed")
    if not (isinstance(bits, int) and 1 <= bits <= 8):
        raise ValueError(f"lockstep.hooks.qsgd: bits={bits!r}; choose 1..8")
    if not (isinstance(bucket_size, int) and bucket_size >= 1):
        raise ValueError(f"lockstep.hooks.qsgd: bucket_size={bucket_size!r}; must be >= 1")
    if skip is not None and model is None:
        raise ValueError("lockstep.hooks.qsgd: skip= needs model= (the names it sees)")
    names = {}
    if model is not None:
        names = {id(p): n for n, p in model.named_parameters()}
    return QsgdState(process_group, bits, bucket_size, min_numel, skip, names, seed), _hook


def _quantize(x, levels, bucket_size, gen):
    """x: float32, numel a multiple of bucket_size. Returns (codes uint8, lo, step)."""
    b = x.view(-1, bucket_size)
    lo = b.min(dim=1).values
    hi = b.max(dim=1).values
    step = (hi - lo) / levels
    safe = torch.where(step > 0, step, torch.ones_like(step))
    u = torch.rand(b.shape, generator=gen, dtype=torch.float32)
    codes = torch.floor((b - lo[:, None]) / safe[:, None] + u).clamp_(0, levels)
    codes = torch.where(step[:, None] > 0, codes, torch.zeros_like(codes))
    return codes.to(torch.uint8).view(-1), lo, step


def _dequantize(codes, lo, step, bucket_size):
    c = codes.view(-1, bucket_size).to(torch.float32)
    return (lo[:, None] + c * step[:, None]).view(-1)


def _compressed_mean(state, flat, group, world, rank):
    levels = (1 << state.bits) - 1
    bs = state.bucket_size
    n = flat.numel()
    per = -(-n // (world * bs)) * bs  # each rank's part: whole buckets
    x = torch.zeros(world * per, dtype=torch.float32)
    x[:n] = flat.to(torch.float32)
    gen = torch.Generator().manual_seed(
        (state.seed * 1_000_003 + state.step) * 65_537 + rank)
    # phase 1: quantize everything (own part is replaced by exact values at the owner)
    codes, lo, step = _quantize(x, levels, bs, gen)
    meta = torch.stack([lo, step], dim=1).reshape(-1)  # per bucket: lo, step
    r_codes = torch.empty_like(codes)
    r_meta = torch.empty_like(meta)
    dist.all_to_all_single(r_codes, codes, group=group)
    dist.all_to_all_single(r_meta, meta, group=group)
    nb = per // bs
    acc = x[rank * per:(rank + 1) * per].clone()
    for r in range(world):
        if r == rank:
            continue
        m = r_meta[r * 2 * nb:(r + 1) * 2 * nb].view(nb, 2)
        acc += _dequantize(r_codes[r * per:(r + 1) * per], m[:, 0], m[:, 1], bs)
    acc /= world
    # phase 2: the owner's mean, quantized once, decoded alike by every rank
    c2, lo2, st2 = _quantize(acc, levels, bs, gen)
    meta2 = torch.stack([lo2, st2], dim=1).reshape(-1)
    all_codes = torch.empty(world * per, dtype=torch.uint8)
    all_meta = torch.empty(world * 2 * nb, dtype=torch.float32)
    dist.all_gather_into_tensor(all_codes, c2, group=group)
    dist.all_gather_into_tensor(all_meta, meta2, group=group)
    m = all_meta.view(-1, 2)
    out = _dequantize(all_codes, m[:, 0], m[:, 1], bs)
    return out[:n].to(flat.dtype)


def _hook(state, bucket):
    group = state.process_group or dist.group.WORLD
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    flat = bucket.buffer()
    params = bucket.parameters()
    skipped = state.skip is not None and any(
        state.skip(state.names.get(id(p), "")) for p in params)
    fut = torch.futures.Future()
    step_done = bucket.is_last()  # the rounding stream moves on once per DDP step
    if (world == 1 or skipped or flat.numel() < state.min_numel
            or flat.dtype not in (torch.float32, torch.bfloat16, torch.float16)):
        if step_done:
            state.step += 1
        flat.div_(world)
        return dist.all_reduce(flat, group=group, async_op=True).get_future().then(
            lambda f: f.value()[0])
    flat.copy_(_compressed_mean(state, flat, group, world, rank))
    if step_done:
        state.step += 1
    fut.set_result(flat)
    return fut
