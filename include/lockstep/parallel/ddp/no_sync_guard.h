// lockstep/parallel/ddp/no_sync_guard.h: the RAII guard returned by
// DistributedDataParallel::no_sync().
#pragma once

#include <lockstep/parallel/ddp/reducer.h>

namespace lockstep::ddp {

// While alive, forward/backward passes through the DDP wrapper do not
// communicate: gradients only accumulate in param.grad. The first synchronized
// backward after it reduces the accumulated sum. Restores the previous setting
// on destruction (guards nest). Movable, not copyable; must not outlive the DDP
// object. Whether a backward synchronizes is decided at its forward (as in
// PyTorch): forward inside the guard, backward after it -> no sync.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer& r) : reducer_(&r), previous_(r.require_sync()) {
    r.set_require_sync(false);
  }
  NoSyncGuard(NoSyncGuard&& o) noexcept : reducer_(o.reducer_), previous_(o.previous_) {
    o.reducer_ = nullptr;
  }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  ~NoSyncGuard() {
    if (reducer_) reducer_->set_require_sync(previous_);
  }

 private:
  Reducer* reducer_;
  bool previous_;
};

}  // namespace lockstep::ddp
