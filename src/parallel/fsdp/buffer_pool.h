// FSDP's unit-sized buffers, kept and reused from step to step (docs/fsdp.md, "Memory").
//
// Every step gathers each unit's parameters into a buffer of the unit's size, and fills and
// reduce-scatters a flat gradient buffer of that size, each freed within the step. Taken
// from malloc each time, under lockstep-run's heap-only malloc settings, those blocks are
// scattered over a heap that never returns memory, and the fragments between them are too
// small for the next large block: the largest model FSDP trained under a memory cap was
// 1.16x DDP's instead of about P times. The pool keeps each block once made and hands it
// out again for the next buffer of the same size: the blocks alive at once (a unit
// computing, one prefetched, the root; a gradient filling, one reducing) are all it ever
// holds. Blocks come from libtorch's allocator for their device (on the CPU lockstep's
// host cache once init() ran: each a mapping of its own, outside malloc's heap;
// docs/host-memory.md; on a GPU the CUDA caching allocator) and go back to it when the
// pool and every tensor using one are gone.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace lockstep::fsdp {

class BufferPool {
 public:
  BufferPool();
  // A 1-D tensor of `numel` elements in a pooled block (contents undefined); the block
  // returns to the pool when the tensor's storage is released.
  at::Tensor empty(int64_t numel, const at::TensorOptions& options);
  // Gives `t`'s storage a pooled block of `bytes` (contents undefined), or none for 0; the
  // block it held returns to the pool. The tensor and its views keep their shapes (and
  // must not be read while their storage holds no block).
  void set_storage(const at::Tensor& t, int64_t bytes);
  // Bytes in blocks the pool made, handed out or free.
  int64_t held_bytes() const;

  struct Shared;  // the blocks; also held by every block handed out

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace lockstep::fsdp
