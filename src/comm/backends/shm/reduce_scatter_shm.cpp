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
//
// Zero copy: when every rank's input lies at the same place of one shared allocation
// (ProcessGroup::alloc_shared), rank r reduces slice r straight from every rank's input
// into its output, then posts; the op ends when every rank has posted (no rank leaves
// while a peer still reads its input). Per rank: its slice of each of the P inputs read
// once and its output written once, (P + 1) N / P bytes for an output of N / P, the
// memory roofline's minimum, against the staged path's copies of every other slice into
// staging and out of it. (Non-temporal stores for large outputs, which skip the read of
// each output line, measured no faster at 64 MiB.)
#include "comm/backends/shm/shm_backend.h"
#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstring>

namespace lockstep::comm::shm {
void ShmBackend::reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                                const OpContext& ctx) {
  const int64_t n = out.numel();
  const int64_t es = static_cast<int64_t>(in.element_size());
  const char* src = static_cast<const char*>(in.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const uint64_t in_bytes = static_cast<uint64_t>(in.numel() * es);
  const SharedPlace place =
      size_ > 1 && n > 0 ? regions_.locate(rank_, src, in_bytes) : SharedPlace{};
  Waiter w =
      begin(OpKind::ReduceScatter, n, in.scalar_type(), op, -1, ctx, nullptr, 0, 0, place.code());
  if (n == 0) return;
  if (size_ == 1) {
    if (dst != src) std::memcpy(dst, src, n * es);
    return;
  }
  const int P = size_, me = rank_;
  // out may alias our slice of in (in-place use); then reduce via an L1 block (zero copy)
  // or our unused staging region.
  const char* my_in = src + me * n * es;
  const bool aliased = dst < my_in + n * es && my_in < dst + n * es;
  last_zero_copy_ = all_shared_at(place.code());
  if (last_zero_copy_) {  // our slice of every rank's input, where it lies
    std::vector<const char*> from(P);
    for (int r = 0; r < P; ++r) from[r] = place.region->base[r] + place.offset + me * n * es;
    if (aliased) {  // dst is our own slice of `in`: through reduce_to's L1 block
      reduce_to(from, {dst}, n, es, in.scalar_type(), op, 0, 0);
    } else {
      const std::vector<const void*> srcs(from.begin(), from.end());
      reduce_many(dst, srcs.data(), P, n, in.scalar_type(), op);
    }
    post();
    wait_all(w, step());
    return;
  }
  std::vector<const void*> srcs(P);
  const int64_t m = region_elems(es);
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
