// Internal: device (CUDA) tensors through a ProcessGroup, ordered with the caller's stream.
//
// At issue (the caller's thread) an event `ready` is recorded on the caller's current
// stream. On the comm thread, before the backend runs:
// - a backend that works on host memory (shm, gloo, mpi, hier) gets pinned host twins:
//   the inputs are copied into them on a staging stream that waits for `ready`, and the
//   comm thread waits for that stream only (never the device); after the op, the outputs
//   are copied back on the staging stream and an event `done` is recorded;
// - a backend that takes device tensors (nccl) gets them as they are, once `ready` has
//   passed (it returns when its op has finished on the device).
// The op runs with the staging stream current, so what it queues on the device itself
// (avg's division on nccl) precedes `done`, recorded on that stream after it.
// Work::wait() makes the waiter's current stream wait for `done`: the host does not block
// on the copy back, and what the waiter queues afterwards sees the result (c10d's
// contract). The calls are c10's device-generic stream and event API, so this file
// builds against every libtorch, CPU-only ones included (where no tensor takes this path).
#pragma once

#include <lockstep/comm/types.h>

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

namespace lockstep::comm {

class DeviceStaging {
 public:
  explicit DeviceStaging(bool backend_takes_device_tensors)
      : native_(backend_takes_device_tensors) {}

  // The tensor the backend gets for `t`: `t` itself unless it is a device tensor that the
  // backend cannot take, else its pinned host twin. `in`: the op reads it; `out`: writes it.
  at::Tensor add(const at::Tensor& t, bool in, bool out);

  // `run` as the comm thread must call it: between the copies in and out when some
  // tensor was a device tensor (and records `ready` now), else `run` itself.
  std::function<void(const OpContext&)> wrap(std::function<void(const OpContext&)> run);

  // For Work::on_wait: the waiter's stream waits for the copies back (empty: nothing to do).
  std::function<void()> waiter() const;

 private:
  struct State;
  const bool native_;
  std::shared_ptr<State> state_;  // null until a device tensor is added
};

}  // namespace lockstep::comm
