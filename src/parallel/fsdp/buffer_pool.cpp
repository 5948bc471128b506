// FSDP's pool of unit-sized buffers; see buffer_pool.h.
#include "buffer_pool.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

#include <mutex>
#include <unordered_map>
#include <vector>

namespace lockstep::fsdp {

// Blocks come from libtorch's CPU allocator: lockstep's host cache once init() ran (each
// block a mapping of its own, outside malloc's heap: docs/host-memory.md).
struct BufferPool::Shared {
  std::mutex mu;
  std::unordered_map<int64_t, std::vector<at::DataPtr>> free;  // by block size in bytes
  int64_t held = 0;
};

namespace {

constexpr int64_t kAlign = 64;

// One block handed out: where it goes back to.
struct Lease {
  std::shared_ptr<BufferPool::Shared> pool;
  at::DataPtr block;
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
    lease->pool->free[lease->bytes].push_back(std::move(lease->block));
  }
  delete lease;
}

// A block of at least `bytes` (rounded up to kAlign), free or new, as a DataPtr whose
// deleter returns it.
at::DataPtr lease_block(const std::shared_ptr<BufferPool::Shared>& pool, int64_t bytes) {
  const int64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  at::DataPtr block;
  {
    std::lock_guard<std::mutex> l(pool->mu);
    auto& list = pool->free[size];
    if (!list.empty()) {
      block = std::move(list.back());
      list.pop_back();
    }
  }
  if (!block) {
    block = c10::GetCPUAllocator()->allocate(size_t(size));  // throws when out of memory
    std::lock_guard<std::mutex> l(pool->mu);
    pool->held += size;
  }
  void* p = block.get();
  return at::DataPtr(p, new Lease{pool, std::move(block), size}, &give_back, at::Device(at::kCPU));
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
