// lockstep's host memory cache: libtorch's CPU allocator for large blocks (docs/host-memory.md).
//
// A training step allocates the same large tensors every time (gradients, activations,
// FSDP's gathered units) and frees them within the step. Served by glibc, they either
// page-fault through fresh memory every step (each block its own mmap) or cut the heap into
// holes that later, larger blocks do not fit (the brk heap, lockstep-run's setting before
// this cache). The cache maps each large block on its own and keeps it when freed, for the
// next block of about its size: after the first step no block is faulted in again, and a
// block no one asks for again goes back to the system instead of pinning the heap.
//
//  - blocks of kHostCacheMinBytes and more: mmap()ed, a freed one kept and handed to the
//    next request of its size up to 1/16 smaller; kept bytes never exceed
//    kHostCacheKeepFactor times the peak of live large bytes (above it, the blocks freed
//    longest ago are unmapped);
//  - smaller blocks: the allocator that was installed before (glibc's malloc);
//  - a failed mmap (out of memory, RLIMIT_DATA) empties the cache and tries once more, then
//    throws c10::Error naming the size and what the cache held.
//
// lockstep::init() installs it unless LOCKSTEP_HOST_CACHE=0 (or a build with AddressSanitizer,
// whose checks need every block from malloc), and never over an allocator the program set.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::comm {

struct HostCacheStats {
  int64_t live_bytes = 0;       // large blocks in use
  int64_t peak_live_bytes = 0;  // the most ever in use at once
  int64_t cached_bytes = 0;     // freed large blocks kept for reuse
  int64_t hits = 0;             // requests served from the cache
  int64_t maps = 0;             // requests that mapped a new block
  int64_t emptied = 0;          // times the cache was emptied (empty_host_cache or a failed map)
};

inline constexpr size_t kHostCacheMinBytes = size_t(1) << 17;  // 128 KiB
// Kept bytes <= this x the live peak. A step's distinct blocks add up to more than its
// peak in use (backward asks for sizes forward did not; CTSM's keys carry one position more
// than its queries, blocks 1/64 apart): at 1x its demo unmapped and re-faulted ~13 a step.
inline constexpr int64_t kHostCacheKeepFactor = 2;

// Makes the cache libtorch's CPU allocator. True when it is (now or already); false when the
// program installed another allocator first, which is kept.
bool install_host_cache();
bool host_cache_installed();
// Whether init() installs it: LOCKSTEP_HOST_CACHE (0/1), default on except under ASan.
bool host_cache_wanted();
HostCacheStats host_cache_stats();
// Unmaps every kept block (live ones stay): memory back to the system.
void empty_host_cache();

}  // namespace lockstep::comm
