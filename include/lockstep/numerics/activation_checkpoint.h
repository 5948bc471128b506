// lockstep/numerics/activation_checkpoint.h: activation checkpointing. A block's forward runs
// without keeping its intermediate activations; backward runs the block again (with the
// forward's RNG and autocast state, so dropout masks and dtypes are the same) and
// differentiates the recomputation. Memory: the block's inputs instead of everything
// autograd would save inside it; time: one more forward of the block per step.
//
//   auto y = lockstep::numerics::activation_checkpoint(
//       [&](const std::vector<torch::Tensor>& in) { return std::vector{block->forward(in[0])}; },
//       {x}, block->parameters())[0];
//
//   using lockstep::numerics::checkpoint_wrapper;
//   torch::nn::Sequential net(checkpoint_wrapper(Block()), checkpoint_wrapper(Block()));
//   // a module per layer
//
// Contract (docs/memory.md):
//  - `fn` must compute the same outputs when run again with the same inputs, RNG and
//    autocast state (no other randomness, no state that changes between the runs), and
//    must not modify its inputs in place (detected: InvalidArgument).
//  - Every tensor `fn` reads that requires grad and is not one of `inputs` must be in
//    `params` (the block's parameters). Their gradients leave the checkpoint in the outer
//    backward and enter the parameters' normal accumulators once, so DDP's and FSDP's
//    gradient hooks fire as without checkpointing. A leaf that is missing from `params`
//    is an InvalidArgument in backward (its gradient would be lost otherwise).
//  - Modules that update state in forward (BatchNorm's running statistics) update it
//    twice: in forward and in the recomputation.
//  - Backward with create_graph (double backward) is not supported: InvalidArgument.
//  - Under FSDP, the checkpoint goes inside a unit (FSDP wraps the checkpointed layer);
//    a checkpoint around an FSDP unit fails in backward when the unit runs again.
//  - With grad mode off, or when no input or parameter requires grad, `fn` just runs.
//  - lockstep::numerics::dropout calls inside `fn` (numerics/dropout.h) keep their masks from the
//    forward for the recomputation (ActivationCheckpointOptions::keep_dropout_masks); other random
//    ops draw again from the replayed RNG state. Either way the numbers are the same.
// Which layers and sub-blocks to checkpoint: numerics/activation_checkpoint_policy.h.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <ostream>
#include <vector>

namespace lockstep::numerics {

using ActivationCheckpointFn =
    std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

struct ActivationCheckpointOptions {
  // Keep the masks that lockstep::numerics::dropout draws inside the function (1 byte per element,
  // held from forward to backward) instead of drawing them again in the recomputation,
  // which on the CPU costs more than the rest of a dropout-heavy block. False: only the
  // inputs are kept and the masks are drawn again from the replayed RNG state.
  bool keep_dropout_masks = true;
};

// Runs `fn(inputs)` without saving its activations for backward; see the contract above.
// Inputs and outputs must be defined tensors; outputs that are not floating point, or do
// not depend on anything that requires grad, come back with requires_grad false.
std::vector<torch::Tensor> activation_checkpoint(const ActivationCheckpointFn& fn,
                                                 const std::vector<torch::Tensor>& inputs,
                                                 const std::vector<torch::Tensor>& params = {},
                                                 const ActivationCheckpointOptions& options = {});

// One tensor in, one out.
torch::Tensor activation_checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                                    const torch::Tensor& input,
                                    const std::vector<torch::Tensor>& params = {},
                                    const ActivationCheckpointOptions& options = {});

// A layer (tensor in, tensor out) whose forward is checkpointed, with the layer's own
// parameters declared. Transparent, like fsdp::wrap: it registers the layer's parameters,
// buffers and children under their own names, so state dicts are the same with and
// without it. Under FSDP, wrap this wrapper (not the other way round).
class CheckpointedImpl : public torch::nn::Module {
 public:
  explicit CheckpointedImpl(torch::nn::AnyModule inner, ActivationCheckpointOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  const std::shared_ptr<torch::nn::Module>& inner() const { return inner_; }
  // Off: a plain forward of the layer (e.g. to compare memory and time).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  void pretty_print(std::ostream& stream) const override;

 private:
  torch::nn::AnyModule any_;
  std::shared_ptr<torch::nn::Module> inner_;
  ActivationCheckpointOptions options_;
  bool enabled_ = true;
};
TORCH_MODULE(Checkpointed);

template <class M>
Checkpointed checkpoint_wrapper(const torch::nn::ModuleHolder<M>& layer,
                                ActivationCheckpointOptions options = {}) {
  return Checkpointed(torch::nn::AnyModule(layer), options);
}
template <class M>
Checkpointed checkpoint_wrapper(std::shared_ptr<M> layer,
                                ActivationCheckpointOptions options = {}) {
  return Checkpointed(torch::nn::AnyModule(std::move(layer)), options);
}

}  // namespace lockstep::numerics
