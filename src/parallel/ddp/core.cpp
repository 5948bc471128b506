// The non-template part of DistributedDataParallel; see include/lockstep/parallel/ddp/core.h.
#include <lockstep/error.h>
#include <lockstep/parallel/ddp/core.h>
#include <lockstep/parallel/ddp/model_check.h>

#include <unordered_set>

namespace lockstep::ddp {

DDPCore::DDPCore(std::shared_ptr<torch::nn::Module> module,
                 std::shared_ptr<comm::ProcessGroup> group, DDPOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  LOCKSTEP_CHECK(module_ != nullptr, "DistributedDataParallel: null module");
  LOCKSTEP_CHECK(group_ != nullptr, "DistributedDataParallel: null process group");

  // Distinct parameters in registration order (a tensor shared by two submodules
  // appears once: one autograd hook, one bucket slot).
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::unordered_set<const void*> seen;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  verify_same_model(*group_, names, params);

  std::vector<at::Tensor> buffers;
  for (const auto& b : module_->buffers(/*recurse=*/true))
    if (seen.insert(b.unsafeGetTensorImpl()).second) buffers.push_back(b);
  std::vector<at::Tensor> state = params;
  state.insert(state.end(), buffers.begin(), buffers.end());
  StateBroadcaster(state, group_).broadcast();  // one-off: temporary flat buffers
  if (options_.broadcast_buffers && group_->size() > 1 && !buffers.empty())
    buffers_ = std::make_unique<StateBroadcaster>(buffers, group_);

  std::vector<std::string> grad_names;
  std::vector<at::Tensor> grad_params;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].requires_grad()) continue;
    grad_names.push_back(names[i]);
    grad_params.push_back(params[i]);
  }
  reducer_ = std::make_unique<Reducer>(grad_params, grad_names, group_, options_);
}

void DDPCore::before_forward() {
  if (buffers_) buffers_->broadcast();
  reducer_->prepare_for_forward();
}

}  // namespace lockstep::ddp
