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
// Small tensors (<= small_bytes) take a one-handshake path: each rank's copy rides
// along with the descriptor round in its small slot, then every rank reduces all P
// copies (same order, so same bits).
#include "comm/reduce_kernels.h"
#include "comm/shm/shm_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

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

// Reduces n elements of srcs into `shared` (for the peers) and `own` (our tensor).
// Done in L1-sized blocks so the second copy reads from cache: one pass over
// memory instead of reduce-then-copy's two.
void reduce_part(char* shared, char* own, std::vector<const void*>& srcs, int64_t n, int64_t es,
                 at::ScalarType dt, ReduceOp op) {
  const int64_t block = (16 << 10) / es;
  std::vector<const void*> s(srcs.size());
  for (int64_t off = 0; off < n; off += block) {
    const int64_t m = std::min(block, n - off);
    for (size_t r = 0; r < srcs.size(); ++r) s[r] = static_cast<const char*>(srcs[r]) + off * es;
    reduce_many(shared + off * es, s.data(), static_cast<int>(s.size()), m, dt, op);
    std::memcpy(own + off * es, shared + off * es, m * es);
  }
}

}  // namespace

void ShmBackend::allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) {
  const int64_t n = t.numel();
  const int64_t es = static_cast<int64_t>(t.element_size());
  char* data = static_cast<char*>(t.data_ptr());
  const at::ScalarType dt = t.scalar_type();
  const int P = size_;
  const int me = rank_;
  std::vector<const void*> srcs(P);

  if (P > 1 && static_cast<uint64_t>(n * es) <= options_.small_bytes) {
    // One handshake: the data travels with the descriptor round.
    begin(OpKind::Allreduce, n, dt, op, -1, ctx, data, n * es);
    for (int r = 0; r < P; ++r) srcs[r] = small_slot(r);
    reduce_many(data, srcs.data(), P, n, dt, op);
    return;
  }
  Waiter w = begin(OpKind::Allreduce, n, dt, op, -1, ctx);
  if (P == 1 || n == 0) return;

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
    reduce_part(mine + b0, src + b0, srcs, parts.len(me), es, dt, op);
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
