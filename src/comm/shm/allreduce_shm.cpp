// Allreduce in shared memory: reduce-scatter + allgather through the staging buffers.
//
// Large tensors stream through in chunks of up to buffer_bytes per rank. For chunk c
// (staging buffer b = c % 2), with the chunk cut into P cache-line-aligned parts:
//   1. copy in:  rank r copies every part EXCEPT its own into its buffer b. Only rank
//                r reads part r, and it reads it straight from its own tensor.
//   2. post, wait for all ranks' copy-in.
//   3. reduce:   rank r reduces part r over ranks 0..P-1 in rank order (identical
//                bits everywhere) into its buffer b, slot r (unused by step 1), and
//                copies the result into its own tensor.
//   4. post; copy out: for each peer q, as soon as q has posted, copy part q of q's
//                buffer b into the tensor.
// Per rank and element this moves ~2 reads + 2 writes of tensor-sized memory
// instead of the 3 + 3 of copy-everything-in / copy-everything-out, and with
// chunks that fit in the shared cache most staging traffic never reaches DRAM.
// Buffer b is reused by chunk c+2 only after every peer has posted copy-in of
// chunk c+1, which each peer does after finishing its copy-out of chunk c.
//
// Small tensors take a one-phase path: everybody copies the whole tensor in, one
// handshake, everybody reduces all P copies (same order, so same bits).
#include "comm/reduce_kernels.h"
#include "comm/shm/shm_backend.h"

#include <algorithm>
#include <cstring>

namespace lockstep::comm::shm {
namespace {

// Part p of a chunk of m elements, in elements; parts are multiples of 128 bytes.
struct Parts {
  int64_t q;  // elements per part (last ones may be shorter or empty)
  int64_t m;
  int64_t begin(int p) const { return std::min(m, q * p); }
  int64_t len(int p) const { return std::min(m, q * (p + 1)) - begin(p); }
};

Parts split(int64_t m, int P, int64_t elem) {
  const int64_t align = std::max<int64_t>(1, 128 / elem);
  const int64_t per = (m + P - 1) / P;
  return Parts{(per + align - 1) / align * align, m};
}

}  // namespace

void ShmBackend::allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) {
  Waiter w = begin(OpKind::Allreduce, t.numel(), t.scalar_type(), op, -1, ctx);
  const int64_t n = t.numel();
  if (size_ == 1 || n == 0) return;
  const int64_t es = static_cast<int64_t>(t.element_size());
  char* data = static_cast<char*>(t.data_ptr());
  const at::ScalarType dt = t.scalar_type();
  const int P = size_;
  const int me = rank_;
  std::vector<const void*> srcs(P);

  if (static_cast<uint64_t>(n * es) <= std::min(options_.small_bytes, buffer_bytes())) {
    std::memcpy(segment().staging(me, 0), data, n * es);
    post();
    wait_all(w, step());
    for (int r = 0; r < P; ++r) srcs[r] = segment().staging(r, 0);
    reduce_many(data, srcs.data(), P, n, dt, op);
    return;
  }

  const int64_t chunk = static_cast<int64_t>(buffer_bytes()) / es;
  const uint64_t base = step();
  int64_t c = 0;
  for (int64_t off = 0; off < n; off += chunk, ++c) {
    const Parts parts = split(std::min(chunk, n - off), P, es);
    char* const mine = segment().staging(me, static_cast<int>(c % 2));
    char* const src = data + off * es;
    const int64_t b0 = parts.begin(me) * es, b1 = b0 + parts.len(me) * es;
    // 1. copy in everything but our own part
    std::memcpy(mine, src, b0);
    std::memcpy(mine + b1, src + b1, parts.m * es - b1);
    post();
    wait_all(w, base + 2 * c + 1);
    // 3. reduce our part, in rank order
    for (int r = 0; r < P; ++r)
      srcs[r] = r == me ? static_cast<const void*>(src + b0)
                        : segment().staging(r, static_cast<int>(c % 2)) + b0;
    reduce_many(mine + b0, srcs.data(), P, parts.len(me), dt, op);
    std::memcpy(src + b0, mine + b0, b1 - b0);
    post();
    // 4. copy out the others' parts as they become ready (nearest peer first)
    for (int k = 1; k < P; ++k) {
      const int q = (me + k) % P;
      wait_peer(w, q, base + 2 * c + 2);
      const int64_t q0 = parts.begin(q) * es;
      std::memcpy(src + q0, segment().staging(q, static_cast<int>(c % 2)) + q0,
                  parts.len(q) * es);
    }
  }
}

}  // namespace lockstep::comm::shm
