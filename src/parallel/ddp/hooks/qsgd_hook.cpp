// The QSGD DDP communication hook (see include/lockstep/parallel/ddp/hooks/qsgd_hook.h).
#include <lockstep/parallel/ddp/hooks/qsgd_hook.h>

#include <map>
#include <memory>
#include <mutex>

namespace lockstep::ddp::hooks {
namespace {

using compress::apply_env;
using compress::CompressedAllreduce;
using compress::LayerSpan;
using compress::QsgdOptions;

struct HookState {
  QsgdOptions options;
  std::mutex mu;  // hooks run one at a time, but the state must not rely on it
  std::map<int64_t, std::shared_ptr<CompressedAllreduce>> plans;  // by bucket index
  std::map<int64_t, std::vector<int64_t>> layouts;                // offsets+numels signature
};

std::vector<LayerSpan> spans_of(const ddp::GradBucket& b) {
  std::vector<LayerSpan> s;
  for (size_t i = 0; i < b.names.size(); ++i) s.push_back({b.names[i], b.offsets[i], b.numels[i]});
  return s;
}

std::vector<int64_t> signature(const ddp::GradBucket& b) {
  std::vector<int64_t> sig{b.buffer.numel(), b.world_size};
  for (size_t i = 0; i < b.offsets.size(); ++i) {
    sig.push_back(b.offsets[i]);
    sig.push_back(b.numels[i]);
    sig.push_back(int64_t(std::hash<std::string>{}(b.names[i])));
  }
  return sig;
}

}  // namespace

CommHook qsgd(QsgdOptions options) {
  if (options.use_env) options = apply_env(std::move(options));
  compress::validate(options);
  auto state = std::make_shared<HookState>();
  state->options = std::move(options);
  return [state](comm::ProcessGroup& group, const ddp::GradBucket& bucket) {
    std::lock_guard<std::mutex> lock(state->mu);
    at::Tensor buf = bucket.buffer;
    ddp::HookResult r;
    const at::ScalarType dt = buf.scalar_type();
    if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) {  // e.g. float64
      r.bytes = buf.numel() * int64_t(buf.element_size());
      r.work = group.allreduce(buf);
      return r;
    }
    auto sig = signature(bucket);
    auto& plan = state->plans[bucket.index];
    if (!plan || state->layouts[bucket.index] != sig) {
      plan = std::make_shared<CompressedAllreduce>(state->options, spans_of(bucket), buf.numel(),
                                                   group.size());
      state->layouts[bucket.index] = std::move(sig);
    }
    // The whole exchange runs on the comm thread as one composite op, so backward goes on
    // while it runs. The plan (and the buffer, owned by the reducer) stay alive through the
    // finish step, which raises NonFiniteGradient (naming the layer) on every rank alike.
    r.work = plan->run_async(group, buf, /*average=*/false);
    r.bytes = plan->last_stats().bytes_sent;
    r.finish = [plan] { plan->finish(); };
    return r;
  };
}

}  // namespace lockstep::ddp::hooks
