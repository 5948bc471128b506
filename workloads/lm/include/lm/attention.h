// lm/attention.h: causal multi-head self-attention.
//
// Position t attends to positions 0..t of its own sequence and nothing later: -inf is added
// to the scores of later keys before the softmax, whose weight for them is then exactly 0,
// so a later token changes no earlier output, not even by rounding. Written with batched
// matmuls (libtorch 1.13's C++ API has no scaled_dot_product_attention, and its
// MultiheadAttention takes [L, B, D] and separate masks); one fused q/k/v projection, and
// the scaling and the mask folded into the score matmul (baddbmm), which on the CPU saves
// two passes over the [B heads, T, T] scores forward and one backward. Everything runs in
// the parameters' dtype (bfloat16 under FSDP's mixed precision; libtorch's CPU softmax
// accumulates bfloat16 in float32).
#pragma once

#include <lockstep/numerics/dropout.h>

#include <torch/torch.h>

namespace lm {

struct CausalSelfAttentionOptions {
  int64_t d_model = 128;
  int64_t heads = 4;
  double dropout = 0.0;  // on the attention weights
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(CausalSelfAttentionOptions o);
  // x: [B, T, D] -> [B, T, D].
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear& qkv() { return qkv_; }
  torch::nn::Linear& proj() { return proj_; }

 private:
  CausalSelfAttentionOptions o_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
  lockstep::numerics::Dropout drop_{nullptr};  // its masks are kept by a checkpoint, not redrawn
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace lm
