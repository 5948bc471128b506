#include "fsdp_memory.h"

#include <lockstep/compat.h>

#include <c10/core/CPUAllocator.h>

#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

namespace lockstep::bench {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void raise_peak(int64_t live) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// Counts around the allocator installed before it (lockstep's host cache, or libtorch's
// default): each block's size and the inner allocation kept by address, so the data
// pointer stays the context (raw_allocate) and the inner allocator frees its own block.
at::Allocator* g_inner = nullptr;
std::mutex g_mu;
std::unordered_map<void*, std::pair<at::DataPtr, size_t>> g_blocks;

void counted_free(void* data) {
  if (data == nullptr) return;
  std::pair<at::DataPtr, size_t> block;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_blocks.find(data);
    block = std::move(it->second);
    g_blocks.erase(it);
  }
  g_live.fetch_sub(static_cast<int64_t>(block.second), std::memory_order_relaxed);
}  // block.first frees the inner allocation

// libtorch 2.3 made allocate() non-const and added copy_data() (Allocator::clone).
class CountingAllocator final : public at::Allocator {
 public:
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 3)
  at::DataPtr allocate(size_t n) override {
#else
  at::DataPtr allocate(size_t n) const override {
#endif
    if (n == 0) return {nullptr, nullptr, &counted_free, at::Device(at::kCPU)};
    at::DataPtr inner = g_inner->allocate(n);  // throws when out of memory
    void* data = inner.get();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_blocks.emplace(data, std::make_pair(std::move(inner), n));
    }
    raise_peak(g_live.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) +
               static_cast<int64_t>(n));
    return {data, data, &counted_free, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &counted_free; }
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

int64_t status_kb(const std::string& text, const char* key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? 0 : std::stoll(text.substr(at + std::strlen(key))) * 1024;
}

}  // namespace

void install_counting_allocator() {
  static CountingAllocator allocator;
  g_inner = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&allocator, /*priority=*/100);
}

int64_t live_tensor_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t peak_tensor_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak_tensor_bytes() { g_peak.store(g_live.load()); }

void StorageBytes::add(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  if (seen_.insert(t.storage().unsafeGetStorageImpl()).second)
    bytes_ += static_cast<int64_t>(t.storage().nbytes());
}

ProcMemory read_proc_memory() {
  std::ifstream f("/proc/self/status");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return {status_kb(text, "VmRSS:"), status_kb(text, "VmHWM:"), status_kb(text, "VmData:")};
}

void set_data_limit(int64_t bytes) {
  rlimit r{static_cast<rlim_t>(bytes), static_cast<rlim_t>(bytes)};
  if (setrlimit(RLIMIT_DATA, &r) != 0)
    throw std::runtime_error(std::string("setrlimit(RLIMIT_DATA): ") + std::strerror(errno));
}

}  // namespace lockstep::bench
