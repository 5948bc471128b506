// Internal: memory every rank of an shm group maps (ProcessGroup::alloc_shared).
//
// One allocation is one POSIX shm object per rank, "<segment name>-a<id>-r<rank>",
// created by its rank and mapped by every rank; the names are unlinked as soon as all
// ranks have mapped them (as the segment's), so nothing outlives the job. Rank r's
// tensor is its own object. The peers' objects are mapped too, so an allreduce over
// tensors that lie at the same place of the same allocation on every rank reads and
// writes all ranks' data directly, with no staging copy (allreduce_shm.cpp).
//
// Freeing is local: when a rank's tensor storage dies, its deleter unmaps that rank's
// own object and its mappings of the peers'. A rank's memory is returned to /dev/shm
// once every rank has freed its tensor of that allocation.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace lockstep::comm::shm {

// One allocation as this rank sees it: where each rank's object is mapped here.
struct SharedRegion {
  uint64_t id = 0;
  size_t bytes = 0;
  std::vector<char*> base;  // per rank; null where not mapped (yet)
  SharedRegion() = default;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();  // unmaps every mapping
};

// Where a byte range lies in a shared region, as the descriptor carries it.
struct SharedPlace {
  const SharedRegion* region = nullptr;  // null: not in shared memory
  size_t offset = 0;
  // Nonzero code for the descriptor: (id + 1) << 40 | offset; equal on two ranks iff
  // their ranges start at the same place of the same allocation. 0 (the staged path)
  // where the code could alias: past 2^23 allocations or a 1 TiB offset.
  uint64_t code() const {
    if (region == nullptr || region->id >= (uint64_t{1} << 23) || offset >= (size_t{1} << 40))
      return 0;
    return (region->id + 1) << 40 | static_cast<uint64_t>(offset);
  }
};

// This rank's live allocations. Thread-safe: tensors die on any thread.
class SharedRegions {
 public:
  SharedRegions() : state_(std::make_shared<State>()) {}
  // Wraps `rank`'s mapping of `r` in a tensor of `numel` elements of `dtype`; `r`
  // stays registered until the tensor's storage is freed.
  at::Tensor adopt(std::unique_ptr<SharedRegion> r, int rank, int64_t numel, at::ScalarType dtype);
  // Where [p, p + bytes) of `rank`'s memory lies, if wholly inside one allocation.
  SharedPlace locate(int rank, const void* p, size_t bytes) const;
  size_t live() const;  // allocations still mapped here

 private:
  struct State {
    mutable std::mutex mu;
    std::map<uintptr_t, std::unique_ptr<SharedRegion>> by_base;  // keyed by our own base
  };
  std::shared_ptr<State> state_;  // shared with the deleters: tensors may outlive us
};

}  // namespace lockstep::comm::shm
