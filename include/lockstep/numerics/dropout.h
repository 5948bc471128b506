// lockstep/numerics/dropout.h: dropout whose mask a checkpoint keeps instead of drawing it
// again in the recomputation (docs/memory.md, "Selective checkpointing").
//
//   auto y = lockstep::numerics::dropout(x, 0.1, is_training());     // a function
//   drop = register_module("drop", lockstep::numerics::Dropout(0.1)); // a drop-in for nn::Dropout
//
// Contract:
//  - Outside a checkpoint (or inside one made with keep_dropout_masks = false) it is
//    torch::dropout: the same values and the same random numbers consumed.
//  - Inside a checkpoint that keeps masks, on CPU tensors with 0 < p < 1, the forward
//    draws the mask exactly as torch::dropout does (same values, same RNG stream) and keeps
//    it as a bool tensor (1 byte per element, beside the block's inputs); the recomputation
//    in backward takes the kept mask instead of drawing it, and sets the CPU generator to
//    the state the forward left after the draw. Outputs and gradients are bit-identical to
//    the plain model's. Why: on the CPU, drawing the mask (bernoulli) costs more than the
//    rest of a dropout-heavy block's forward, so recomputing it is what made checkpointing
//    with dropout slow; a kept mask is 1/4 of the float noise autograd keeps without a
//    checkpoint.
//  - On other devices (CUDA draws masks cheaply) it is torch::dropout, and the
//    recomputation replays the forward's RNG state as for any random op.
//  - Thread-compatible: the checkpoint frames are thread-local.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace lockstep::numerics {

// Zeroes each element with probability p and scales the rest by 1/(1-p) when `train`;
// `x` itself otherwise. p in [0, 1] (torch::dropout's check).
torch::Tensor dropout(const torch::Tensor& x, double p, bool train);

// A module around lockstep::numerics::dropout, training per Module::is_training(); no parameters or
// buffers, so it replaces torch::nn::Dropout without changing a state dict.
class DropoutImpl : public torch::nn::Cloneable<DropoutImpl> {
 public:
  explicit DropoutImpl(double p = 0.5);
  torch::Tensor forward(const torch::Tensor& x);
  void reset() override {}
  void pretty_print(std::ostream& stream) const override;
  double p() const { return p_; }

 private:
  double p_;
};
TORCH_MODULE(Dropout);

}  // namespace lockstep::numerics
