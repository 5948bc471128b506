// Shared allocations: the registry, and the collective that creates one
// (ShmBackend::alloc_shared). See shared_region.h.
#include "comm/backends/shm/shared_region.h"
#include "comm/backends/shm/shm_backend.h"

#include <ATen/ATen.h>

#include <sys/mman.h>

#include <cstdio>

namespace lockstep::comm::shm {

SharedRegion::~SharedRegion() {
  for (char* p : base)
    if (p != nullptr) ::munmap(p, bytes);
}

at::Tensor SharedRegions::adopt(std::unique_ptr<SharedRegion> r, int rank, int64_t numel,
                                at::ScalarType dtype) {
  char* own = r->base.at(rank);
  std::shared_ptr<State> state = state_;
  at::Tensor t = at::from_blob(
      own, {numel},
      [state](void* p) {
        std::unique_ptr<SharedRegion> gone;  // unmapped outside the lock
        std::lock_guard<std::mutex> lk(state->mu);
        auto it = state->by_base.find(reinterpret_cast<uintptr_t>(p));
        if (it == state->by_base.end()) return;
        gone = std::move(it->second);
        state->by_base.erase(it);
      },
      at::TensorOptions().dtype(dtype));
  std::lock_guard<std::mutex> lk(state_->mu);  // (if from_blob threw, r unmapped itself)
  state_->by_base[reinterpret_cast<uintptr_t>(own)] = std::move(r);
  return t;
}

SharedPlace SharedRegions::locate(int rank, const void* p, size_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(state_->mu);
  auto it = state_->by_base.upper_bound(at);
  if (it == state_->by_base.begin()) return {};
  --it;
  const SharedRegion& r = *it->second;
  const auto own = reinterpret_cast<uintptr_t>(r.base[rank]);
  if (at < own || at + bytes > own + r.bytes) return {};
  return SharedPlace{&r, static_cast<size_t>(at - own)};
}

size_t SharedRegions::live() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->by_base.size();
}

// Three descriptor rounds: agree on the size (mismatch -> CommError), vote that every
// rank created its object, vote that every rank mapped every peer's (then all unlink).
// Any rank's failure makes every rank return an undefined tensor, so the callers keep
// agreeing on what is shared. If a round throws (a peer died, a timeout), every name
// of this allocation is unlinked on the way out: whoever survives removes them.
at::Tensor ShmBackend::alloc_shared(int64_t numel, at::ScalarType dtype, const OpContext& ctx) {
  begin(OpKind::AllocShared, numel, dtype, ReduceOp::Sum, -1, ctx);
  auto region = std::make_unique<SharedRegion>();
  region->id = shared_allocs_++;
  region->bytes = std::max<size_t>(1, numel * c10::elementSize(dtype));
  region->bytes = (region->bytes + 4095) / 4096 * 4096;
  region->base.assign(size_, nullptr);
  auto name = [&](int r) { return lockstep::detail::concat(seg_name_, "-a", region->id, "-r", r); };
  std::string why;
  auto attempt = [&](auto&& f) {
    if (!why.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      why = e.what();
    }
  };
  auto vote = [&] {
    begin(OpKind::AllocShared, numel, dtype, ReduceOp::Sum, -1, ctx, nullptr, 0, why.empty());
    bool all = true;
    for (int r = 0; r < size_; ++r) all = all && variant_of(r) == 1;
    return all;
  };
  bool ok = false;
  try {
    attempt([&] {
      region->base[rank_] =
          create_mapping(name(rank_), region->bytes,
                         "free space in /dev/shm, or set DDPOptions::shared_buckets = false");
    });
    ok = vote();
    for (int r = 0; ok && r < size_; ++r)
      if (r != rank_)
        attempt([&] {
          region->base[r] = open_mapping(name(r), region->bytes, "a peer's allocation differs");
        });
    if (ok) ok = vote();  // every rank has tried every peer's object: the names can go
  } catch (...) {
    for (int r = 0; r < size_; ++r) Segment::unlink(name(r));
    throw;
  }
  if (region->base[rank_] != nullptr) Segment::unlink(name(rank_));
  if (!ok) {
    if (!why.empty())  // one write, so ranks' lines do not interleave
      std::fputs(lockstep::detail::concat("lockstep: shm (rank ", rank_, "): cannot share ",
                                          region->bytes, " bytes with the peers (", why,
                                          "); using private memory instead\n")
                     .c_str(),
                 stderr);
    return {};
  }
  return regions_.adopt(std::move(region), rank_, numel, dtype);
}

}  // namespace lockstep::comm::shm
