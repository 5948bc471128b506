// Reduce-scatter in shared memory. Rank r's staging buffer holds, per chunk, one
// region per destination rank d != r with r's slice d of that chunk; rank d then
// reduces its slice over ranks 0..P-1 in rank order (its own slice straight from
// its input) into its output.
//
// The output is written with plain stores even when large: non-temporal ones (through
// an L1 block, which a reduction needs) measured 10-25% slower here at 16-64 MiB,
// although they skip the read of each output line (docs/algorithms.md, memory roofline).
//
// Buffer reuse follows allgather: chunk c + 2 overwrites buffer c % 2 only after
// every peer has posted chunk c + 1's copy-in, i.e. after it finished chunk c.
#include "comm/backends/shm/shm_backend.h"
#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstring>

namespace lockstep::comm::shm {

void ShmBackend::reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                                const OpContext& ctx) {
  const int64_t n = out.numel();
  Waiter w = begin(OpKind::ReduceScatter, n, in.scalar_type(), op, -1, ctx);
  const int64_t es = static_cast<int64_t>(in.element_size());
  const char* src = static_cast<const char*>(in.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  if (n == 0) return;
  if (size_ == 1) {
    if (dst != src) std::memcpy(dst, src, n * es);
    return;
  }
  const int P = size_, me = rank_;
  const int64_t m = region_elems(es);
  // out may alias our slice of in (in-place use); then reduce via our unused region.
  const char* my_in = src + me * n * es;
  const bool aliased = dst < my_in + n * es && my_in < dst + n * es;
  std::vector<const void*> srcs(P);
  const uint64_t base = step();
  int64_t c = 0;
  for (int64_t off = 0; off < n; off += m, ++c) {
    const int64_t len = std::min(m, n - off);
    const int b = static_cast<int>(c % 2);
    char* const mine = segment().staging(me, b);
    stage_others(b, src, n, off, len, m, es);
    post();
    wait_all(w, base + 2 * c + 1);
    for (int r = 0; r < P; ++r)
      srcs[r] = r == me ? static_cast<const void*>(my_in + off * es)
                        : segment().staging(r, b) + me * m * es;
    char* target = aliased ? mine + me * m * es : dst + off * es;
    reduce_many(target, srcs.data(), P, len, in.scalar_type(), op);
    if (aliased) std::memcpy(dst + off * es, target, len * es);
    post();
  }
}

}  // namespace lockstep::comm::shm
