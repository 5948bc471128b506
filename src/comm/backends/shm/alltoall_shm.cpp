// Alltoall in shared memory. Rank r stages, per chunk, its slice d for every
// destination d != r in region d of its buffer; rank d copies region d out of each
// peer's buffer as soon as that peer has posted. Every slice of a chunk is staged
// before any output of that chunk is written, so out may even be the same tensor
// as in.
#include "comm/backends/shm/shm_backend.h"

#include <algorithm>
#include <cstring>

namespace lockstep::comm::shm {

void ShmBackend::alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) {
  const int64_t total = in.numel();
  Waiter w = begin(OpKind::Alltoall, total, in.scalar_type(), ReduceOp::Sum, -1, ctx);
  const int P = size_, me = rank_;
  const int64_t es = static_cast<int64_t>(in.element_size());
  const int64_t n = total / P;
  const char* src = static_cast<const char*>(in.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  if (n == 0) return;
  const int64_t m = region_elems(es);
  const uint64_t base = step();
  int64_t c = 0;
  for (int64_t off = 0; off < n; off += m, ++c) {
    const int64_t len = std::min(m, n - off);
    const int b = static_cast<int>(c % 2);
    stage_others(b, src, n, off, len, m, es);
    post();
    const int64_t own = (me * n + off) * es;
    if (dst != src) std::memcpy(dst + own, src + own, len * es);
    for (int k = 1; k < P; ++k) {
      const int q = (me + k) % P;
      wait_peer(w, q, base + 2 * c + 1);
      std::memcpy(dst + (q * n + off) * es, segment().staging(q, b) + me * m * es, len * es);
    }
    post();
  }
}

}  // namespace lockstep::comm::shm
