// Broadcast in shared memory: the root streams the tensor through its two staging
// buffers; every other rank copies each chunk out as soon as the root posts it.
//
// Each chunk costs every rank two counter bumps (the root's right after copying
// in, the others' after copying out), so all counters stay in step. The root
// reuses buffer c % 2 only after all peers have finished chunk c - 2.
#include "comm/backends/shm/shm_backend.h"

#include <algorithm>
#include <cstring>

namespace lockstep::comm::shm {

void ShmBackend::broadcast(at::Tensor& t, int root, const OpContext& ctx) {
  Waiter w = begin(OpKind::Broadcast, t.numel(), t.scalar_type(), ReduceOp::Sum, root, ctx);
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  if (size_ == 1 || bytes == 0) return;
  char* data = static_cast<char*>(t.data_ptr());
  const int64_t chunk = static_cast<int64_t>(buffer_bytes());
  const uint64_t base = step();
  int64_t c = 0;
  for (int64_t off = 0; off < bytes; off += chunk, ++c) {
    const int64_t len = std::min(chunk, bytes - off);
    char* const buf = segment().staging(root, static_cast<int>(c % 2));
    if (rank_ == root) {
      if (c >= 2) wait_all(w, base + 2 * (c - 2) + 2);
      std::memcpy(buf, data + off, len);
      post();
      post();
    } else {
      wait_peer(w, root, base + 2 * c + 1);
      std::memcpy(data + off, buf, len);
      post();
      post();
    }
  }
}

}  // namespace lockstep::comm::shm
