"""lockstep.hooks.qsgd on PyTorch DDP over "gloo" and over "lockstep": the loss decreases
and the replicas stay bit-identical; skip= leaves the named layers uncompressed."""

import sys

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import lockstep
import training

STEPS = 40


def train_with_hook(group, rank, world):
    model = training.mlp()
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.05)
    seen = []
    state, hook = lockstep.hooks.qsgd(model=model, process_group=group, bits=4,
                                      skip=lambda name: seen.append(name) or name == "4.bias")
    ddp.register_comm_hook(state, hook)
    first, last = training.train(ddp, rank, STEPS)
    same = training.parameters_identical(ddp, world, group)
    return first, last, same, state.step, "4.bias" in seen


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lk = dist.new_group(backend="lockstep")
    ok = True
    for name, group in (("gloo", dist.group.WORLD), ("lockstep", lk)):
        first, last, same, steps, named = train_with_hook(group, rank, world)
        if rank == 0:
            print(f"DDP + lockstep.hooks.qsgd (4 bits) over {name}, {world} ranks, {STEPS} steps: "
                  f"loss {first:.4f} -> {last:.4f}; replicas bit-identical: {same}; "
                  f"DDP steps seen by the hook {steps}; skip saw names: {named}")
        ok = ok and same and last < 0.8 * first and steps == STEPS and named
    try:
        lockstep.hooks.qsgd(bits=4, bucketsize=3)
        ok = False
    except ValueError as e:
        ok = ok and "bucketsize" in str(e)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
