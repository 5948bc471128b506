// lockstep/parallel/ddp/distributed_data_parallel.h: the user-facing DDP wrapper.
//
//   auto group = lockstep::init();
//   auto model = std::make_shared<Net>();          // or a TORCH_MODULE holder
//   lockstep::DistributedDataParallel ddp(model, group);   // DDPOptions{} by default
//   torch::optim::SGD opt(ddp.parameters(), 0.1);
//   opt.zero_grad(); loss_fn(ddp(x), y).backward(); opt.step();
//
// Contract:
//  - Construction is collective and verifies that all ranks hold the same model
//    (ModelMismatch otherwise), then copies rank 0's parameters and buffers to all.
//  - Every call of forward()/operator() is a collective when broadcast_buffers is
//    on (and, once, for the bucket rebuild): call it the same number of times on
//    every rank. Each synchronized backward averages the gradients over ranks
//    before backward() returns, overlapping the communication with backward.
//  - The wrapper keeps the module alive (shared ownership) but the module must
//    not gain or lose parameters afterwards.
//  - Not copyable; movable. Backward passes of one DDP object must not run
//    concurrently.
#pragma once

#include <lockstep/parallel/ddp/core.h>
#include <lockstep/parallel/ddp/grad_bucket.h>
#include <lockstep/parallel/ddp/hooks/default_hooks.h>
#include <lockstep/parallel/ddp/model_check.h>
#include <lockstep/parallel/ddp/options.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <utility>

namespace lockstep::ddp {

template <class M>
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<M> module, std::shared_ptr<comm::ProcessGroup> group,
                          DDPOptions options = {})
      : module_(std::move(module)),
        core_(std::make_unique<DDPCore>(module_, std::move(group), options)) {}
  DistributedDataParallel(const torch::nn::ModuleHolder<M>& holder,
                          std::shared_ptr<comm::ProcessGroup> group, DDPOptions options = {})
      : DistributedDataParallel(holder.ptr(), std::move(group), options) {}

  // Pre-forward work (buffer broadcast, reducer preparation), then module->forward(...).
  template <class... A>
  decltype(auto) forward(A&&... args) {
    core_->before_forward();
    return module_->forward(std::forward<A>(args)...);
  }
  template <class... A>
  decltype(auto) operator()(A&&... args) {
    return forward(std::forward<A>(args)...);
  }

  std::vector<at::Tensor> parameters(bool recurse = true) const {
    return module_->parameters(recurse);
  }
  torch::OrderedDict<std::string, at::Tensor> named_parameters(bool recurse = true) const {
    return module_->named_parameters(recurse);
  }
  const std::shared_ptr<M>& module() const { return module_; }
  M* operator->() const { return module_.get(); }

  // Gradients accumulate locally while the guard lives; see NoSyncGuard.
  [[nodiscard]] NoSyncGuard no_sync() { return core_->no_sync(); }
  // Replace the reduction of each bucket (default: an in-place average of the grads,
  // see reducer.h; a hook gets the bucket through the copy path).
  void register_comm_hook(CommHook hook) { core_->reducer().register_comm_hook(std::move(hook)); }
  // Statistics of the last synchronized backward (for logs and lockstep-bench).
  const StepStats& last_step_stats() const { return core_->reducer().last_step_stats(); }

  Reducer& reducer() { return core_->reducer(); }
  comm::ProcessGroup& process_group() { return core_->group(); }
  const DDPOptions& options() const { return core_->options(); }

 private:
  std::shared_ptr<M> module_;
  std::unique_ptr<DDPCore> core_;  // stable address: autograd hooks point into it
};

template <class M>
DistributedDataParallel(std::shared_ptr<M>, std::shared_ptr<comm::ProcessGroup>)
    -> DistributedDataParallel<M>;
template <class M>
DistributedDataParallel(std::shared_ptr<M>, std::shared_ptr<comm::ProcessGroup>, DDPOptions)
    -> DistributedDataParallel<M>;
template <class M>
DistributedDataParallel(torch::nn::ModuleHolder<M>, std::shared_ptr<comm::ProcessGroup>)
    -> DistributedDataParallel<M>;
template <class M>
DistributedDataParallel(torch::nn::ModuleHolder<M>, std::shared_ptr<comm::ProcessGroup>, DDPOptions)
    -> DistributedDataParallel<M>;

}  // namespace lockstep::ddp

namespace lockstep {
using ddp::DDPOptions;
using ddp::DistributedDataParallel;
}  // namespace lockstep
