// lockstep-bench fsdp: how a rank's memory is measured and capped.
//
//  - Tensor bytes: a counting CPU allocator (install_counting_allocator) in front of c10's
//    own allocation functions counts every CPU tensor storage libtorch allocates, live and
//    peak. Storages that do not come from the allocator (the shm backend's shared
//    allocations, e.g. DDP's shared buckets) are not counted.
//  - Storage bytes: the bytes of a set of tensors' storages, each storage once
//    (StorageBytes), for the model state: parameters, gradients, optimizer state.
//  - The process: VmRSS, VmHWM (peak RSS) and VmData from /proc/self/status.
//  - The cap: RLIMIT_DATA (set_data_limit), which bounds the process's private writable
//    address space (heap, anonymous mappings, thread stacks) and needs no privilege. Shared
//    mappings (/dev/shm segments) are outside it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_set>
#include <vector>

namespace lockstep::bench {

// Installs the counting allocator as libtorch's CPU allocator (once per process, before the
// tensors to count are created).
void install_counting_allocator();
int64_t live_tensor_bytes();
int64_t peak_tensor_bytes();
void reset_peak_tensor_bytes();  // the peak restarts from the live bytes

// Sums the bytes of storages, each storage once.
class StorageBytes {
 public:
  void add(const at::Tensor& t);
  void add(const std::vector<at::Tensor>& ts) {
    for (const auto& t : ts) add(t);
  }
  int64_t bytes() const { return bytes_; }

 private:
  std::unordered_set<const void*> seen_;
  int64_t bytes_ = 0;
};

// Fields of /proc/self/status, in bytes (0 if absent).
struct ProcMemory {
  int64_t rss = 0, hwm = 0, data = 0;
};
ProcMemory read_proc_memory();

// Sets RLIMIT_DATA (soft and hard) to `bytes`; throws std::runtime_error on failure.
void set_data_limit(int64_t bytes);

}  // namespace lockstep::bench
