// lockstep/parallel/fsdp/fully_sharded_data_parallel.h: the user-facing FSDP wrapper.
//
//   auto group = lockstep::init();
//   auto model = std::make_shared<Net>();   // its big layers wrapped with fsdp::wrap (wrap.h)
//   lockstep::FullyShardedDataParallel fsdp(model, group);   // FSDPOptions{} by default
//   torch::optim::AdamW opt(fsdp.parameters(), 1e-3);        // the local shards
//   opt.zero_grad(); loss_fn(fsdp(x), y).backward(); opt.step();
//
// Contract (docs/fsdp.md):
//  - Construction is collective: verifies that all ranks hold the same model (ModelMismatch
//    otherwise), copies rank 0's parameters and buffers to all, then shards: each unit's
//    parameters become views into one flat buffer of which this rank keeps 1/P.
//  - forward() gathers each unit's parameters as it runs and frees them after (FullShard);
//    backward() gathers them again, reduce-scatters (averages) the gradients into the
//    shards' .grad() and frees everything before it returns. Every rank must run the same
//    units in the same order, once per forward.
//  - parameters() are the shards: build the optimizer over them, never over the module's
//    own parameters (whose gradients FSDP consumes). Outside forward/backward a sharded
//    unit's parameters hold no memory: reading one raises libtorch's "data is not
//    allocated" error; summon_full_params() / release_full_params() bring them back.
//  - The module must not gain or lose parameters afterwards. Backward passes of one FSDP
//    object must not run concurrently, nor after it is destroyed.
#pragma once
#include <lockstep/parallel/fsdp/core.h>
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/parallel/fsdp/wrap.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <utility>

namespace lockstep::fsdp {

template <class M>
class FullyShardedDataParallel {
 public:
  FullyShardedDataParallel(std::shared_ptr<M> module, std::shared_ptr<comm::ProcessGroup> group,
                           FSDPOptions options = {})
      : module_(std::move(module)),
        core_(std::make_unique<FSDPCore>(module_, std::move(group), std::move(options))) {}
  FullyShardedDataParallel(const torch::nn::ModuleHolder<M>& holder,
                           std::shared_ptr<comm::ProcessGroup> group, FSDPOptions options = {})
      : FullyShardedDataParallel(holder.ptr(), std::move(group), std::move(options)) {}

  // Floating-point tensor arguments are cast to mixed_precision.param_dtype, if set.
  template <class... A>
  auto forward(A&&... args) {
    core_->before_root_forward();
    auto out = module_->forward(core_->cast_input(std::forward<A>(args))...);
    std::vector<at::Tensor> tensors;
    internal::collect(out, tensors);
    core_->after_root_forward(tensors);
    return out;
  }
  template <class... A>
  auto operator()(A&&... args) {
    return forward(std::forward<A>(args)...);
  }

  // The local shards, one per unit: what the optimizer updates.
  std::vector<at::Tensor> parameters() const { return core_->parameters(); }
  double clip_grad_norm(double max_norm) { return core_->clip_grad_norm(max_norm); }
  torch::OrderedDict<std::string, at::Tensor> full_state_dict() { return core_->full_state_dict(); }
  void save_full_state_dict(const std::string& path) { core_->save_full_state_dict(path); }
  std::string sharded_state(const torch::optim::Optimizer* opt = nullptr) const {
    return core_->sharded_state(opt);
  }
  void load_sharded_state(const std::function<std::string(const std::string&)>& read,
                          torch::optim::Optimizer* opt = nullptr) {
    core_->load_sharded_state(read, opt);
  }
  void save_sharded_state(const std::string& dir, const torch::optim::Optimizer* opt = nullptr) {
    core_->save_sharded_state(dir, opt);
  }
  void load_sharded_state(const std::string& dir, torch::optim::Optimizer* opt = nullptr) {
    core_->load_sharded_state(dir, opt);
  }
  void summon_full_params() { core_->summon_full_params(); }
  void release_full_params() { core_->release_full_params(); }
  MemoryStats memory_stats() const { return core_->memory_stats(); }

  const std::shared_ptr<M>& module() const { return module_; }
  M* operator->() const { return module_.get(); }
  FSDPCore& core() { return *core_; }
  comm::ProcessGroup& process_group() { return core_->group(); }
  const FSDPOptions& options() const { return core_->options(); }

 private:
  std::shared_ptr<M> module_;
  std::unique_ptr<FSDPCore> core_;  // stable address: autograd hooks point into it
};

template <class M>
FullyShardedDataParallel(std::shared_ptr<M>, std::shared_ptr<comm::ProcessGroup>)
    -> FullyShardedDataParallel<M>;
template <class M>
FullyShardedDataParallel(std::shared_ptr<M>, std::shared_ptr<comm::ProcessGroup>, FSDPOptions)
    -> FullyShardedDataParallel<M>;
template <class M>
FullyShardedDataParallel(torch::nn::ModuleHolder<M>, std::shared_ptr<comm::ProcessGroup>)
    -> FullyShardedDataParallel<M>;
template <class M>
FullyShardedDataParallel(torch::nn::ModuleHolder<M>, std::shared_ptr<comm::ProcessGroup>,
                         FSDPOptions) -> FullyShardedDataParallel<M>;

}  // namespace lockstep::fsdp

namespace lockstep {
using fsdp::FSDPOptions;
using fsdp::FullyShardedDataParallel;
}  // namespace lockstep
