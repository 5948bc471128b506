// FSDP's pool of unit-sized buffers; see buffer_pool.h.
#include "buffer_pool.h"

#include <lockstep/error.h>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace lockstep::fsdp {

struct BufferPool::Shared {
  std::mutex mu;
  std::unordered_map<int64_t, std::vector<void*>> free;  // by block size in bytes
  int64_t held = 0;
  ~Shared() {
    for (auto& [bytes, blocks] : free)
      for (void* p : blocks) std::free(p);
  }
};

namespace {

constexpr int64_t kAlign = 64;

// One block handed out: where it goes back to.
struct Lease {
  std::shared_ptr<BufferPool::Shared> pool;
  void* ptr;
  int64_t bytes;
};

}  // namespace

BufferPool::BufferPool() : shared_(std::make_shared<Shared>()) {}

int64_t BufferPool::held_bytes() const {
  std::lock_guard<std::mutex> l(shared_->mu);
  return shared_->held;
}

namespace {

void give_back(void* ctx) {
  auto* lease = static_cast<Lease*>(ctx);
  {
    std::lock_guard<std::mutex> l(lease->pool->mu);
    lease->pool->free[lease->bytes].push_back(lease->ptr);
  }
  delete lease;
}

// A block of at least `bytes` (rounded up to kAlign), free or new, as a DataPtr whose
// deleter returns it.
at::DataPtr lease_block(const std::shared_ptr<BufferPool::Shared>& pool, int64_t bytes) {
  const int64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> l(pool->mu);
    auto& list = pool->free[size];
    if (!list.empty()) {
      p = list.back();
      list.pop_back();
    }
  }
  if (p == nullptr) {
    p = std::aligned_alloc(size_t(kAlign), size_t(size));
    if (p == nullptr)
      throw Error(detail::concat("FSDP: cannot allocate a buffer of ", size, " bytes"));
    std::lock_guard<std::mutex> l(pool->mu);
    pool->held += size;
  }
  return at::DataPtr(p, new Lease{pool, p, size}, &give_back, at::Device(at::kCPU));
}

}  // namespace

at::Tensor BufferPool::empty(int64_t numel, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  const int64_t bytes = numel * int64_t(t.element_size());
  if (bytes == 0) return t;
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, lease_block(shared_, bytes),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return t.set_(storage, 0, {numel}, {1});
}

void BufferPool::set_storage(const at::Tensor& t, int64_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(bytes > 0 ? lease_block(shared_, bytes) : at::DataPtr());
  s->set_nbytes(size_t(bytes));
}

}  // namespace lockstep::fsdp
