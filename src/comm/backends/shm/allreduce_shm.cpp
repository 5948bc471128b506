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
// allreduce_coalesced runs the same algorithm over a list of tensors seen as one flat
// array: copies and reductions are cut at tensor boundaries, and nothing is flattened.
// Avg divides each reduced block while it is still in L1 (no extra pass).
//
// Two paths for the staging writes of steps 1 and 3 (path_choice.h): Cached, plain
// stores, so peers read the chunk from the cache the cores share; Streaming,
// non-temporal stores, so peers read it from memory, for cores that share no cache.
// Rank 0 picks one per op by timing both; the choice rides in the descriptor. Both
// paths reduce in the same order, so they give the same bits.
//
// Zero copy: when every rank's tensor lies at the same place of one shared allocation
// (ProcessGroup::alloc_shared; DDP's buckets), rank r reduces part r straight from all
// ranks' tensors and writes the result into all of them, then posts; an op ends when
// every rank has posted. Per rank and element: one read and one write, against two and
// two through the staging buffers, and no chunking: one handshake before, one after.
//
// Small tensors (<= small_bytes) take a one-handshake path: each rank's copy rides
// along with the descriptor round in its small slot, then every rank reduces all P
// copies (same order, so same bits).
#include "comm/backends/shm/shm_backend.h"
#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace lockstep::comm::shm {
namespace {

constexpr int kMaxSmallRanks = 64;  // the small path's source list lives on the stack

// Same-dtype contiguous tensors seen as one flat byte array, in list order.
class Flat {
 public:
  explicit Flat(const std::vector<at::Tensor>& ts) {
    int64_t at = 0;
    for (const auto& t : ts) {
      const int64_t b = t.numel() * static_cast<int64_t>(t.element_size());
      if (b == 0) continue;
      ptrs_.push_back(static_cast<char*>(t.data_ptr()));
      starts_.push_back(at);
      at += b;
    }
    starts_.push_back(at);  // sentinel: the total
  }
  int64_t bytes() const { return starts_.back(); }
  // The whole array if it is one tensor, else null.
  char* contiguous() const { return ptrs_.size() == 1 ? ptrs_[0] : nullptr; }
  // f(ptr, rel, len) for each contiguous run of the bytes [b, b + n); rel counts from b.
  template <class F>
  void each(int64_t b, int64_t n, F&& f) const {
    if (n <= 0) return;
    size_t i = std::upper_bound(starts_.begin(), starts_.end() - 1, b) - starts_.begin() - 1;
    for (int64_t rel = 0; rel < n; ++i) {
      const int64_t len = std::min(n - rel, starts_[i + 1] - (b + rel));
      f(ptrs_[i] + (b + rel - starts_[i]), rel, len);
      rel += len;
    }
  }
  void gather(char* dst, int64_t b, int64_t n, bool streaming = false) const {
    each(b, n, [&](char* p, int64_t rel, int64_t len) {
      if (streaming)
        copy_streaming(dst + rel, p, len);
      else
        std::memcpy(dst + rel, p, len);
    });
  }
  void scatter(const char* src, int64_t b, int64_t n) const {
    each(b, n, [&](char* p, int64_t rel, int64_t len) { std::memcpy(p, src + rel, len); });
  }

 private:
  std::vector<char*> ptrs_;
  std::vector<int64_t> starts_;
};

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
  const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  if (size_ > 1 && bytes <= options_.small_bytes && t.is_contiguous()) {
    // The latency path: no tensor list, no Flat, no allocation.
    allreduce_small(static_cast<char*>(t.data_ptr()), t.numel(), t.scalar_type(), op, ctx);
    return;
  }
  std::vector<at::Tensor> one{t};
  allreduce_coalesced(one, op, ctx);
}

void ShmBackend::allreduce_small(char* data, int64_t n, at::ScalarType dt, ReduceOp op,
                                 const OpContext& ctx) {
  // One handshake: the data travels with the descriptor round (one post, one wait per
  // peer), then each rank reduces the P small slots in rank order (the same bits on
  // every rank) straight into its tensor.
  const int64_t es = static_cast<int64_t>(c10::elementSize(dt));
  begin(OpKind::Allreduce, n, dt, op, -1, ctx, data, static_cast<size_t>(n * es));
  if (n == 0) return;
  const int P = size_;
  const ReduceOp rop = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  if (P > kMaxSmallRanks) {  // rare: a heap list
    std::vector<const void*> many(P);
    for (int r = 0; r < P; ++r) many[r] = small_slot(r);
    reduce_many(data, many.data(), P, n, dt, rop);
  } else {
    const void* srcs[kMaxSmallRanks];
    for (int r = 0; r < P; ++r) srcs[r] = small_slot(r);
    reduce_many(data, srcs, P, n, dt, rop);
  }
  if (op == ReduceOp::Avg) divide_inplace(data, n, dt, P);
}

void ShmBackend::allreduce_coalesced(std::vector<at::Tensor>& ts, ReduceOp op,
                                     const OpContext& ctx) {
  const Flat flat(ts);
  const at::ScalarType dt = ts.at(0).scalar_type();
  const int64_t es = static_cast<int64_t>(ts[0].element_size());
  const int64_t n = flat.bytes() / es;
  const int P = size_;
  const int me = rank_;
  const int64_t divisor = op == ReduceOp::Avg ? P : 0;
  const ReduceOp rop = op == ReduceOp::Avg ? ReduceOp::Sum : op;

  if (P > 1 && static_cast<uint64_t>(n * es) <= options_.small_bytes) {
    char* data = flat.contiguous();
    if (data != nullptr || n == 0) {
      allreduce_small(data, n, dt, op, ctx);
      return;
    }
    std::vector<char> gathered(n * es);
    flat.gather(gathered.data(), 0, n * es);
    allreduce_small(gathered.data(), n, dt, op, ctx);
    flat.scatter(gathered.data(), 0, n * es);
    return;
  }
  const uint64_t bytes = static_cast<uint64_t>(n * es);
  const SharedPlace place = P > 1 && flat.contiguous() != nullptr
                                ? regions_.locate(me, flat.contiguous(), bytes)
                                : SharedPlace{};
  const ShmPath want = me == 0 && P > 1 ? paths().choose(bytes) : ShmPath::Cached;
  Waiter w = begin(OpKind::Allreduce, n, dt, op, -1, ctx, nullptr, 0, static_cast<int32_t>(want),
                   place.code());
  if (P == 1 || n == 0) return;
  last_zero_copy_ = all_shared_at(place.code());
  if (last_zero_copy_) {
    // our part of every rank's tensor, reduced in place into all of them
    const Parts parts = split(n, P, es);
    std::vector<char*> part(P);
    for (int r = 0; r < P; ++r)
      part[r] = place.region->base[r] + place.offset + parts.begin(me) * es;
    reduce_to({part.begin(), part.end()}, part, parts.len(me), es, dt, rop, divisor, 0);
    post();
    wait_all(w, step());
    return;
  }
  const bool streaming = leader_variant() == static_cast<int32_t>(ShmPath::Streaming);
  const auto t0 = Clock::now();

  const int64_t chunk = static_cast<int64_t>(buffer_bytes()) / es;
  const uint64_t base = step();
  std::vector<const char*> from(P);
  int64_t c = 0;
  for (int64_t off = 0; off < n; off += chunk, ++c) {
    const Parts parts = split(std::min(chunk, n - off), P, es);
    const int buf = static_cast<int>(c % 2);
    char* const mine = segment().staging(me, buf);
    const int64_t at = off * es;  // the chunk's first byte in the flat array
    const int64_t b0 = parts.begin(me) * es, b1 = b0 + parts.len(me) * es;
    // 1. copy in everything but our own part
    flat.gather(mine, at, b0, streaming);
    flat.gather(mine + b1, at + b1, parts.m * es - b1, streaming);
    post();
    wait_all(w, base + 2 * c + 1);
    // 3. reduce our part, in rank order, reading our own input in place
    flat.each(at + b0, b1 - b0, [&](char* p, int64_t rel, int64_t len) {
      for (int r = 0; r < P; ++r) from[r] = r == me ? p : segment().staging(r, buf) + b0 + rel;
      reduce_to(from, {mine + b0 + rel, p}, len / es, es, dt, rop, divisor, streaming ? 1u : 0u);
    });
    post();
    // 4. copy out the others' parts as they become ready (nearest peer first)
    for (int k = 1; k < P; ++k) {
      const int q = (me + k) % P;
      wait_peer(w, q, base + 2 * c + 2);
      const int64_t q0 = parts.begin(q) * es;
      flat.scatter(segment().staging(q, buf) + q0, at + q0, parts.len(q) * es);
    }
  }
  if (me == 0)
    paths().record(want, bytes, std::chrono::duration<double>(Clock::now() - t0).count());
}

}  // namespace lockstep::comm::shm
