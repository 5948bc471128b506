// lm/block.h: one pre-norm decoder block.
//
//   x = h + drop(attn(ln1(h)))          causal self-attention (lm/attention.h)
//   y = x + drop(fc2(gelu(fc1(ln2(x)))))
//
// The two residual branches run through lockstep::numerics::run_residual_layer with the
// block's checkpoint plan (the trainer's [memory] keys), so activation checkpointing
// recomputes the whole block, its attention or its MLP in backward. The block is called
// inside its FSDP unit (lm/model.h wraps it), so a recomputation finds the unit's
// parameters gathered by FSDP's pre-backward hook. Dropout is lockstep::numerics::dropout,
// whose masks a checkpoint keeps: the recomputation is bit-identical to the forward.
#pragma once

#include <lm/attention.h>

#include <lockstep/numerics/activation_checkpoint_policy.h>
#include <lockstep/numerics/dropout.h>

#include <torch/torch.h>

namespace lm {

// ln(x), through float32 when x is bfloat16: libtorch 1.13's CPU layer_norm forward is ~5x
// slower in bfloat16 than the two conversions and a float32 norm (5.0 against 0.6-1.1 ms
// for one [32, 128, 128] norm on one core; backward about equal). The result is x's dtype,
// as ln(x)'s would be.
torch::Tensor layer_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x);

struct BlockOptions {
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t d_ff = 512;
  double dropout = 0.0;
  lockstep::numerics::LayerCheckpointing checkpoint;  // none by default
};

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(BlockOptions o);
  // h: [B, T, D] -> [B, T, D].
  torch::Tensor forward(const torch::Tensor& h);

  CausalSelfAttention& attention() { return attn_; }
  torch::nn::Linear& fc1() { return fc1_; }
  torch::nn::Linear& fc2() { return fc2_; }

 private:
  torch::Tensor attention_branch(const torch::Tensor& h);
  torch::Tensor mlp_branch(const torch::Tensor& x);
  lockstep::numerics::LayerCheckpointing checkpoint_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  lockstep::numerics::Dropout drop_{nullptr};
};
TORCH_MODULE(Block);

}  // namespace lm
