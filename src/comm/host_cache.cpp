// The host memory cache (include/lockstep/comm/host_cache.h; docs/host-memory.md).
#include <lockstep/comm/host_cache.h>
#include <lockstep/compat.h>

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace lockstep::comm {
namespace {

size_t page_round(size_t n) {
  static const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

void release_block(void* data);

class HostCache final : public at::Allocator {
 public:
  explicit HostCache(at::Allocator* small) : small_(small) {}

#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 3)
  at::DataPtr allocate(size_t n) override {
#else
  at::DataPtr allocate(size_t n) const override {
#endif
    return const_cast<HostCache*>(this)->serve(n);
  }
  at::DeleterFnPtr raw_deleter() const override { return &release_block; }
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  // A small block from malloc, retried once the cache is emptied when malloc runs out (the
  // kept blocks may be what stands between it and a memory limit); a large one from take().
  at::DataPtr serve(size_t n) {
    if (n >= kHostCacheMinBytes) {
      void* p = take(page_round(n));
      return {p, p, &release_block, at::Device(at::kCPU)};
    }
    try {
      return small_->allocate(n);
    } catch (const c10::Error&) {
      if (empty() == 0) throw;
    }
    return small_->allocate(n);
  }

  // A block of `size` bytes (page-rounded): a kept one of [size, size + size/16], else a
  // new mapping; on failure the cache is emptied and the mapping tried once more.
  void* take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = kept_.lower_bound(size);
      if (it != kept_.end() && it->first <= size + size / 16) {
        const Block b = it->second;
        by_age_.erase(b.freed);
        kept_.erase(it);
        stats_.cached_bytes -= int64_t(b.size);
        ++stats_.hits;
        return track(b);
      }
    }
    Block b{map(size), size};
    if (b.base == nullptr) {
      const int64_t held = empty();
      b.base = map(size);
      TORCH_CHECK(b.base != nullptr, "lockstep host cache: out of memory: mapping ", size,
                  " bytes failed (", std::strerror(errno), ") with ", stats().live_bytes,
                  " bytes in large blocks in use, after returning ", held,
                  " cached bytes to the system (a memory limit such as ulimit -d, or the "
                  "machine's memory; LOCKSTEP_HOST_CACHE=0 serves every block from malloc)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.maps;
    return track(b);
  }

  // Back into the cache; when the kept bytes would then exceed kHostCacheKeepFactor x the
  // live peak, the blocks freed longest ago are unmapped (sizes no one asks for any more),
  // never the ones in use every step. A pointer the cache did not map is the small
  // allocator's (raw_deallocate).
  void give(void* p) {
    if (p == nullptr) return;
    std::vector<Block> stale;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto it = live_.find(p);
      if (it == live_.end()) {
        lock.unlock();
        small_->raw_deleter()(p);
        return;
      }
      Block b = it->second;
      live_.erase(it);
      stats_.live_bytes -= int64_t(b.size);
      b.freed = ++frees_;
      by_age_.emplace(b.freed, kept_.emplace(b.size, b));
      stats_.cached_bytes += int64_t(b.size);
      while (stats_.cached_bytes > kHostCacheKeepFactor * stats_.peak_live_bytes) {
        auto oldest = by_age_.begin();
        stale.push_back(oldest->second->second);
        stats_.cached_bytes -= int64_t(oldest->second->second.size);
        kept_.erase(oldest->second);
        by_age_.erase(oldest);
      }
    }
    for (const Block& b : stale) unmap(b);
  }

  int64_t empty() {
    std::multimap<size_t, Block> kept;
    {
      std::lock_guard<std::mutex> lock(mu_);
      kept.swap(kept_);
      by_age_.clear();
      stats_.cached_bytes = 0;
      ++stats_.emptied;
    }
    int64_t bytes = 0;
    for (const auto& [size, b] : kept) {
      unmap(b);
      bytes += int64_t(size);
    }
    return bytes;
  }

  HostCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  struct Block {
    void* base = nullptr;
    size_t size = 0;     // page-rounded
    uint64_t freed = 0;  // when it was last freed (kept blocks)
  };

  static void* map(size_t size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  static void unmap(const Block& b) { ::munmap(b.base, b.size); }

  void* track(const Block& b) {  // under mu_
    void* p = b.base;
    live_.emplace(p, b);
    stats_.live_bytes += int64_t(b.size);
    if (stats_.live_bytes > stats_.peak_live_bytes) stats_.peak_live_bytes = stats_.live_bytes;
    return p;
  }

  at::Allocator* small_;
  mutable std::mutex mu_;
  std::multimap<size_t, Block> kept_;                                  // size -> block
  std::map<uint64_t, std::multimap<size_t, Block>::iterator> by_age_;  // kept, oldest first
  uint64_t frees_ = 0;
  std::unordered_map<void*, Block> live_;  // tensor's pointer -> block
  HostCacheStats stats_;
};

// Made once and never destroyed: a tensor may be freed during static destruction.
HostCache*& the_cache() {
  static HostCache* cache = nullptr;
  return cache;
}

void release_block(void* data) { the_cache()->give(data); }

}  // namespace

bool install_host_cache() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  HostCache*& cache = the_cache();
  if (cache != nullptr) return c10::GetCPUAllocator() == cache;
  at::Allocator* current = c10::GetCPUAllocator();
  if (current != c10::GetDefaultCPUAllocator()) return false;
  cache = new HostCache(current);
  c10::SetCPUAllocator(cache, /*priority=*/1);
  return c10::GetCPUAllocator() == cache;
}

bool host_cache_installed() {
  return the_cache() != nullptr && c10::GetCPUAllocator() == the_cache();
}

bool host_cache_wanted() {
  if (const char* v = std::getenv("LOCKSTEP_HOST_CACHE"); v != nullptr && *v != '\0')
    return std::string(v) != "0";
#if defined(__SANITIZE_ADDRESS__)
  return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return false;
#endif
#endif
  return true;
}

HostCacheStats host_cache_stats() {
  return the_cache() != nullptr ? the_cache()->stats() : HostCacheStats{};
}

void empty_host_cache() {
  if (the_cache() != nullptr) the_cache()->empty();
}

}  // namespace lockstep::comm
