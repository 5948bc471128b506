// Built-in DDP communication hooks; see include/lockstep/parallel/ddp/hooks/default_hooks.h.
#include <lockstep/parallel/ddp/hooks/default_hooks.h>

#include <ATen/ATen.h>

#include <memory>
#include <vector>

namespace lockstep::ddp::hooks {

CommHook allreduce_hook() {
  return [](comm::ProcessGroup& group, const GradBucket& bucket) {
    at::Tensor buf = bucket.buffer;
    HookResult r;
    r.bytes = buf.numel() * (int64_t)buf.element_size();
    r.work = group.allreduce(buf);
    return r;
  };
}

namespace {

// Cast to `low`, sum-allreduce, cast back. Staging tensors are cached per bucket
// index (hooks run one at a time, in order, under the reducer's lock).
CommHook low_precision_hook(at::ScalarType low) {
  auto staging = std::make_shared<std::vector<at::Tensor>>();
  auto plain = allreduce_hook();
  return [staging, low, plain](comm::ProcessGroup& group, const GradBucket& bucket) {
    at::Tensor buf = bucket.buffer;
    if (buf.scalar_type() != at::kFloat && buf.scalar_type() != at::kDouble)
      return plain(group, bucket);
    auto& cache = *staging;
    if ((int64_t)cache.size() < bucket.num_buckets) cache.resize(bucket.num_buckets);
    at::Tensor& s = cache[bucket.index];
    if (!s.defined() || s.numel() != buf.numel())
      s = at::empty({buf.numel()}, buf.options().dtype(low));
    s.copy_(buf);
    HookResult r;
    r.bytes = s.numel() * (int64_t)s.element_size();
    r.work = group.allreduce(s);
    at::Tensor held = s;  // keep the staging tensor alive until finish()
    r.finish = [buf, held]() mutable { buf.copy_(held); };
    return r;
  };
}

}  // namespace

CommHook bf16_compress_hook() { return low_precision_hook(at::kBFloat16); }
CommHook fp16_compress_hook() { return low_precision_hook(at::kHalf); }

}  // namespace lockstep::ddp::hooks
