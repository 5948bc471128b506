#include "comm/device_staging.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>

namespace lockstep::comm {

struct DeviceStaging::State {
  struct Pair {
    at::Tensor dev, host;
    bool in, out;
  };
  explicit State(c10::Device d) : device(d), impl(d.type()), ready(d.type()), done(d.type()) {}
  c10::Device device;
  c10::impl::VirtualGuardImpl impl;
  std::vector<Pair> pairs;  // empty on a backend that takes device tensors
  c10::Event ready, done;
  std::optional<c10::Stream> stream;  // the staging stream, taken on the comm thread

  // Comm thread: the inputs' bytes on the host (or, native, the producers finished).
  void before() {
    stream = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
    ready.block(*stream);
    c10::StreamGuard guard(*stream);
    for (auto& p : pairs) {
      impl.recordDataPtrOnStream(p.dev.storage().data_ptr(), *stream);
      if (p.in) p.host.copy_(p.dev, /*non_blocking=*/true);
    }
    impl.synchronizeStream(*stream);  // this stream only: what `ready` covers, and the copies
  }
  // Comm thread, after the op: the outputs back on the device, then `done`.
  void after() {
    for (auto& p : pairs)
      if (p.out) p.dev.copy_(p.host, /*non_blocking=*/true);  // pinned: the block is kept
    done.record(*stream);                                     // until the copy has run
  }
};

at::Tensor DeviceStaging::add(const at::Tensor& t, bool in, bool out) {
  if (!t.defined() || t.device().is_cpu()) return t;
  if (!state_) state_ = std::make_shared<State>(t.device());
  if (native_) return t;
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  state_->pairs.push_back({t, host, in, out});
  return host;
}

std::function<void(const OpContext&)> DeviceStaging::wrap(
    std::function<void(const OpContext&)> run) {
  if (!state_) return run;
  state_->ready.record(state_->impl.getStream(state_->device));
  return [st = state_, run = std::move(run)](const OpContext& ctx) {
    st->before();
    // What the op queues on the device itself (avg's division on nccl) goes on the staging
    // stream too, before `done`.
    c10::StreamGuard guard(*st->stream);
    run(ctx);
    st->after();
  };
}

std::function<void()> DeviceStaging::waiter() const {
  if (!state_) return {};
  return [st = state_] { st->done.block(st->impl.getStream(st->device)); };
}

}  // namespace lockstep::comm
