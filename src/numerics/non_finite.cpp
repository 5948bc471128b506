#include <lockstep/comm/process_group.h>
#include <lockstep/error.h>
#include <lockstep/numerics/non_finite.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>

namespace lockstep::numerics {
namespace {

// Elements per parallel task: large enough that a task outweighs its scheduling.
constexpr int64_t kGrain = 1 << 15;

// One pass: check each element, scale it (skipped for inv_scale == 1). The check looks
// at the value before scaling, as PyTorch's kernel does: an inf that scaling would turn
// finite (it cannot, inv_scale <= 1 in practice) still counts.
template <class T>
bool check_and_scale_cpu(T* data, int64_t n, float inv_scale, bool write) {
  std::atomic<bool> found{false};
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    bool local = false;
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (int64_t i = begin; i < end; ++i) {
      const Acc v = static_cast<Acc>(data[i]);
      local |= !std::isfinite(v);
      if (write) data[i] = static_cast<T>(v * static_cast<Acc>(inv_scale));
    }
    if (local) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

bool check_and_scale_one(const at::Tensor& t, double inv_scale, bool write) {
  LOCKSTEP_CHECK(t.is_floating_point(), "non-finite check of a ", t.scalar_type(),
                 " tensor: floating point tensors only");
  if (!t.is_contiguous()) {
    // Rare (gradients are contiguous): the plain tensor ops, two passes.
    const bool found = !torch::isfinite(t).all().item<bool>();
    if (write) t.mul_(inv_scale);
    return found;
  }
  bool found = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "unscale", [&] {
    found = check_and_scale_cpu<scalar_t>(t.data_ptr<scalar_t>(), t.numel(),
                                          static_cast<float>(inv_scale), write);
  });
  return found;
}

bool cuda_unscale_and_check(const std::vector<at::Tensor>& ts, double inv_scale) {
  const auto dev = ts.front().device();
  auto found = torch::zeros({1}, torch::dtype(torch::kFloat).device(dev));
  auto inv = torch::full({1}, inv_scale, torch::dtype(torch::kFloat).device(dev));
  at::_amp_foreach_non_finite_check_and_unscale_(ts, found, inv);
  return found.item<float>() != 0.0f;
}

}  // namespace

bool unscale_and_check(const std::vector<at::Tensor>& tensors, double inv_scale) {
  std::vector<at::Tensor> cuda;
  bool found = false;
  const bool write = inv_scale != 1.0;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (t.is_cuda())
      cuda.push_back(t);
    else
      found |= check_and_scale_one(t, inv_scale, write);
  }
  if (!cuda.empty()) found |= cuda_unscale_and_check(cuda, inv_scale);
  return found;
}

std::vector<at::Tensor> gradients_of(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> grads;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

bool has_non_finite(const std::vector<at::Tensor>& tensors) {
  return unscale_and_check(tensors, 1.0);
}

std::vector<int> flags_of_ranks(comm::ProcessGroup* group, int flag) {
  LOCKSTEP_CHECK(flag >= 0 && flag < (1 << 24), "flags_of_ranks: flag ", flag, " out of range");
  if (group == nullptr || group->size() == 1) return {flag};
  // One slot per rank, written only by its rank, so the MAX over ranks is every rank's
  // value (floats hold integers below 2^24 exactly): P floats, one small allreduce.
  auto slots = torch::zeros({group->size()}, torch::kFloat);
  slots[group->rank()] = static_cast<float>(flag);
  comm::AllreduceOptions max;
  max.op = comm::ReduceOp::Max;
  group->allreduce(slots, max)->wait();
  std::vector<int> out(static_cast<size_t>(group->size()));
  const auto* s = slots.data_ptr<float>();
  for (size_t r = 0; r < out.size(); ++r) out[r] = static_cast<int>(s[r]);
  return out;
}

std::vector<int> ranks_with_flag(const std::vector<int>& flags) {
  std::vector<int> out;
  for (size_t r = 0; r < flags.size(); ++r)
    if (flags[r] != 0) out.push_back(static_cast<int>(r));
  return out;
}

}  // namespace lockstep::numerics
