// FSDP's pool of unit-sized buffers; see buffer_pool.h.
#include "buffer_pool.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>

#include <mutex>
#include <unordered_map>
#include <vector>

namespace lockstep::fsdp {

// Blocks come from libtorch's allocator for their device: on the CPU lockstep's host cache
// once init() ran (each block a mapping of its own, outside malloc's heap:
// docs/host-memory.md), on a GPU the CUDA caching allocator.
struct BufferPool::Shared {
  std::mutex mu;
  // By device, then block size in bytes.
  std::unordered_map<c10::Device, std::unordered_map<int64_t, std::vector<at::DataPtr>>> free;
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
    lease->pool->free[lease->block.device()][lease->bytes].push_back(std::move(lease->block));
  }
  delete lease;
}

// A block of at least `bytes` (rounded up to kAlign) on `device`, free or new, as a DataPtr
// whose deleter returns it.
at::DataPtr lease_block(const std::shared_ptr<BufferPool::Shared>& pool, int64_t bytes,
                        c10::Device device) {
  const int64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  at::DataPtr block;
  {
    std::lock_guard<std::mutex> l(pool->mu);
    auto& list = pool->free[device][size];
    if (!list.empty()) {
      block = std::move(list.back());
      list.pop_back();
    }
  }
  if (!block) {
    if (device.is_cpu()) {
      block = c10::GetCPUAllocator()->allocate(size_t(size));  // throws when out of memory
    } else {
      c10::DeviceGuard on(device);  // the allocator allocates on the current device
      block = c10::GetAllocator(device.type())->allocate(size_t(size));
    }
    std::lock_guard<std::mutex> l(pool->mu);
    pool->held += size;
  }
  void* p = block.get();
  return at::DataPtr(p, new Lease{pool, std::move(block), size}, &give_back, device);
}

}  // namespace

at::Tensor BufferPool::empty(int64_t numel, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  const int64_t bytes = numel * int64_t(t.element_size());
  if (bytes == 0) return t;
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes,
                       lease_block(shared_, bytes, t.device()),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return t.set_(storage, 0, {numel}, {1});
}

void BufferPool::set_storage(const at::Tensor& t, int64_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(bytes > 0 ? lease_block(shared_, bytes, t.device())
                                   : at::DataPtr(nullptr, t.device()));
  s->set_nbytes(size_t(bytes));
}

}  // namespace lockstep::fsdp
