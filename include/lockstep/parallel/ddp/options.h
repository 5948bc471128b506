// lockstep/parallel/ddp/options.h: the knobs of DistributedDataParallel and their trade-offs.
#pragma once

#include <cstdint>

namespace lockstep::ddp {

struct DDPOptions {
  // Upper bound on one gradient bucket (a bucket closes once it reaches it). Bigger
  // buckets = fewer, more efficient collectives; smaller = earlier overlap with backward.
  int64_t bucket_cap_bytes = int64_t{25} * 1024 * 1024;
  // The first bucket (the gradients ready first, i.e. of the last layers) is kept
  // small so communication starts as early as possible in backward.
  int64_t first_bucket_bytes = int64_t{1} * 1024 * 1024;
  // param.grad() becomes a view into its bucket: saves one copy per gradient and
  // the grad's memory, but grads are then not separate tensors (strides follow the
  // bucket; resetting grad to undefined, e.g. zero_grad(set_to_none) in 2.x, is
  // fine: the next synchronized backward re-attaches the view).
  bool gradient_as_bucket_view = false;
  // On a backend whose ranks share memory (shm), put the buckets in memory every rank
  // maps (ProcessGroup::alloc_shared) and make param.grad() views into them, as
  // gradient_as_bucket_view does: the allreduce then reads and writes the peers'
  // gradients where they lie instead of copying through staging buffers (half the
  // memory traffic). Costs the buckets' size in /dev/shm per rank, in place of the
  // grads' own memory; where /dev/shm is too small it warns once and uses ordinary
  // memory from that bucket on. Other backends ignore it. Must be the same on every
  // rank (on shm a difference is a Mismatch error at construction: some ranks
  // allocate, the others do not).
  bool shared_buckets = true;
  // Allow parameters that get no gradient in a backward (on some or all ranks).
  // Costs one small extra allreduce (the "used" map) per synchronized step.
  // Without it, such a backward raises an error naming the parameters.
  bool find_unused_parameters = false;
  // Broadcast buffers (e.g. batch-norm running statistics) from rank 0 before
  // every forward, so every replica runs with rank 0's buffers.
  bool broadcast_buffers = true;
  // Re-lay out buckets once, after the first synchronized backward, in the order
  // gradients actually became ready there (rank 0's order, broadcast to all).
  bool rebuild_buckets = true;
};

// What the last synchronized step cost; see DistributedDataParallel::last_step_stats().
struct StepStats {
  int64_t step = 0;               // synchronized backward passes so far (1-based; 0 = none)
  double backward_s = 0;          // first gradient hook -> end of backward compute
  double exposed_comm_s = 0;      // time the end-of-backward callback waited for buckets
                                  // (communication NOT hidden behind backward)
  double finalize_s = 0;          // whole end-of-backward callback (wait + write-back)
  int64_t bytes_sent = 0;         // payload bytes the comm hooks reported, summed over buckets
  int64_t buckets = 0;            // buckets reduced
  int64_t unused_parameters = 0;  // parameters that got no gradient on this rank
};

}  // namespace lockstep::ddp
