#include "fsdp_memory.h"

#include <lockstep/compat.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

namespace lockstep::bench {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

// Every block carries its size in a header of one alignment unit, so the data stays
// 64-byte aligned and the deleter knows what to subtract.
constexpr size_t kHeader = 64;

void raise_peak(int64_t live) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

void counted_free(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  size_t n = 0;
  std::memcpy(&n, block, sizeof n);
  g_live.fetch_sub(static_cast<int64_t>(n), std::memory_order_relaxed);
  c10::free_cpu(block);
}

// libtorch 2.3 made allocate() non-const and added copy_data() (Allocator::clone).
class CountingAllocator final : public at::Allocator {
 public:
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 3)
  at::DataPtr allocate(size_t n) override {
#else
  at::DataPtr allocate(size_t n) const override {
#endif
    if (n == 0) return {nullptr, nullptr, &counted_free, at::Device(at::kCPU)};
    char* block = static_cast<char*>(c10::alloc_cpu(n + kHeader));  // throws when out of memory
    std::memcpy(block, &n, sizeof n);
    raise_peak(g_live.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) +
               static_cast<int64_t>(n));
    void* data = block + kHeader;
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
