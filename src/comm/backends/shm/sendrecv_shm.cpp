// Point to point through per-pair single-producer/single-consumer byte rings.
//
// A message is a WireDesc header (tag, dtype, numel, bytes) followed by the
// payload. head/tail are monotonically increasing byte counts, so "full" and
// "empty" never need a spare slot. A message larger than the ring streams
// through it: send returns once the last byte is in the ring, which for big
// messages means the receiver has already consumed most of it (MPI_Send-like).
// The receiver checks the header against what it expects: a different tag, dtype
// or element count is a Mismatch, raised instead of delivering wrong data.
#include "comm/backends/shm/shm_backend.h"

#include <lockstep/error.h>

#include <algorithm>
#include <cstring>

namespace lockstep::comm::shm {
namespace {

// Copies `len` bytes into the ring of `ctl`/`ring`, waiting for space as needed.
void ring_write(Waiter& w, ChannelCtl& ctl, char* ring, uint64_t cap, const char* p, uint64_t len,
                int peer) {
  uint64_t head = ctl.head.load(std::memory_order_relaxed);  // we are the only writer
  while (len > 0) {
    uint64_t space = cap - (head - ctl.tail.load(std::memory_order_acquire));
    if (space == 0) {
      w.wait_until([&] { return head - ctl.tail.load(std::memory_order_acquire) < cap; }, peer);
      space = cap - (head - ctl.tail.load(std::memory_order_acquire));
    }
    const uint64_t at = head % cap;
    const uint64_t n = std::min({len, space, cap - at});
    std::memcpy(ring + at, p, n);
    head += n;
    p += n;
    len -= n;
    ctl.head.store(head, std::memory_order_release);
  }
}

void ring_read(Waiter& w, ChannelCtl& ctl, const char* ring, uint64_t cap, char* p, uint64_t len,
               int peer) {
  uint64_t tail = ctl.tail.load(std::memory_order_relaxed);  // we are the only reader
  while (len > 0) {
    uint64_t avail = ctl.head.load(std::memory_order_acquire) - tail;
    if (avail == 0) {
      w.wait_until([&] { return ctl.head.load(std::memory_order_acquire) != tail; }, peer);
      avail = ctl.head.load(std::memory_order_acquire) - tail;
    }
    const uint64_t at = tail % cap;
    const uint64_t n = std::min({len, avail, cap - at});
    std::memcpy(p, ring + at, n);
    tail += n;
    p += n;
    len -= n;
    ctl.tail.store(tail, std::memory_order_release);
  }
}

OpDesc p2p_desc(const OpContext& ctx, OpKind kind, const at::Tensor& t, int peer, int tag) {
  OpDesc d = ctx.desc;
  d.kind = kind;
  d.numel = t.numel();
  d.dtype = t.scalar_type();
  d.root = peer;
  d.tag = tag;
  return d;
}

}  // namespace

void ShmBackend::send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) {
  LOCKSTEP_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send to rank ", dst, " from rank ",
                 rank_, " of ", size_);
  Waiter w = make_waiter(ctx, p2p_desc(ctx, OpKind::Send, t, dst, tag));
  w.raise_if_failed();
  WireDesc h;
  h.kind = static_cast<int32_t>(OpKind::Send);
  h.dtype = static_cast<int32_t>(t.scalar_type());
  h.tag = tag;
  h.numel = t.numel();
  h.bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  ChannelCtl& ctl = seg_.channel_ctl(rank_, dst);
  char* ring = seg_.channel_data(rank_, dst);
  const uint64_t cap = seg_.config().channel_bytes;
  ring_write(w, ctl, ring, cap, reinterpret_cast<const char*>(&h), sizeof(h), dst);
  ring_write(w, ctl, ring, cap, static_cast<const char*>(t.data_ptr()), h.bytes, dst);
}

void ShmBackend::recv(at::Tensor& t, int src, int tag, const OpContext& ctx) {
  LOCKSTEP_CHECK(src >= 0 && src < size_ && src != rank_, "recv from rank ", src, " at rank ",
                 rank_, " of ", size_);
  Waiter w = make_waiter(ctx, p2p_desc(ctx, OpKind::Recv, t, src, tag));
  w.raise_if_failed();
  ChannelCtl& ctl = seg_.channel_ctl(src, rank_);
  const char* ring = seg_.channel_data(src, rank_);
  const uint64_t cap = seg_.config().channel_bytes;
  WireDesc h;
  ring_read(w, ctl, ring, cap, reinterpret_cast<char*>(&h), sizeof(h), src);
  if (h.tag != tag || h.numel != t.numel() || h.dtype != static_cast<int32_t>(t.scalar_type()))
    w.fail(CommError::Kind::Mismatch, src,
           lockstep::detail::concat(
               "recv from rank ", src, " expected ", t.numel(), " ", dtype_name(t.scalar_type()),
               " elements with tag ", tag, ", rank ", src, " sent ", h.numel, " ",
               dtype_name(static_cast<at::ScalarType>(h.dtype)), " elements with tag ", h.tag));
  ring_read(w, ctl, ring, cap, static_cast<char*>(t.data_ptr()), h.bytes, src);
}

}  // namespace lockstep::comm::shm
