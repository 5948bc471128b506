// Allgather in shared memory: every rank copies its input chunk into its staging
// buffer, posts, and copies each peer's chunk out as soon as that peer has posted.
//
// Buffer c % 2 is rewritten at chunk c + 2 only after we have seen every peer post
// chunk c + 1's copy-in, which each peer does after it finished reading chunk c.
//
// The staging copy uses plain stores (a peer reads it from the cache the cores share);
// the output, when large (ShmOptions::stream_output_bytes), non-temporal ones: it is
// written once and not read here, and such stores skip reading each line of it first,
// which plain stores into memory that is not in cache must do.
#include "comm/backends/shm/shm_backend.h"
#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstring>

namespace lockstep::comm::shm {

void ShmBackend::allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) {
  Waiter w = begin(OpKind::Allgather, in.numel(), in.scalar_type(), ReduceOp::Sum, -1, ctx);
  const int64_t bytes = in.numel() * static_cast<int64_t>(in.element_size());
  const char* src = static_cast<const char*>(in.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const bool streaming = streams_output(static_cast<uint64_t>(bytes) * size_);
  auto copy_out = [&](char* to, const char* from, int64_t len) {
    if (streaming)
      copy_streaming(to, from, len);
    else
      std::memcpy(to, from, len);
  };
  auto copy_own = [&](int64_t off, int64_t len) {
    char* to = dst + rank_ * bytes + off;
    if (to != src + off) copy_out(to, src + off, len);  // in may alias its slot of out
  };
  if (bytes == 0) return;
  if (size_ == 1) return copy_own(0, bytes);
  const int64_t chunk = static_cast<int64_t>(buffer_bytes());
  const uint64_t base = step();
  int64_t c = 0;
  for (int64_t off = 0; off < bytes; off += chunk, ++c) {
    const int64_t len = std::min(chunk, bytes - off);
    const int b = static_cast<int>(c % 2);
    std::memcpy(segment().staging(rank_, b), src + off, len);
    post();
    copy_own(off, len);
    for (int k = 1; k < size_; ++k) {
      const int q = (rank_ + k) % size_;
      wait_peer(w, q, base + 2 * c + 1);
      copy_out(dst + q * bytes + off, segment().staging(q, b), len);
    }
    post();
  }
}

}  // namespace lockstep::comm::shm
