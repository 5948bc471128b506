// ctsm/layer.h: one pre-norm encoder layer of CTSM.
//
// Two streams: h (per position, never containing that position's own outcome) and the
// outcome embedding o (event type + feedback), which is added only on the key/value side.
// Because a query sees only keys strictly earlier in time, no position can read its own
// label, nor the labels of items shipped at the same moment.
#pragma once

#include <ctsm/attention.h>

#include <lockstep/numerics/activation_checkpoint_policy.h>
#include <lockstep/numerics/dropout.h>

#include <vector>

namespace ctsm {

struct CtsmLayerOptions {
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t d_ff = 256;
  double dropout = 0.0;
  // What to recompute in backward instead of keeping: the whole layer, its attention or its
  // MLP residual block, or nothing (lockstep::numerics::CheckpointPolicy::for_layer; the trainer's
  // memory.activation_checkpointing and memory.checkpoint_* keys).
  lockstep::numerics::LayerCheckpointing checkpoint;
};

class CtsmLayerImpl : public torch::nn::Module {
 public:
  explicit CtsmLayerImpl(CtsmLayerOptions o);
  // h, outcome: [B,L,D]; allowed [B,L,L] bool; age_days [B,L,L].
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& outcome,
                        const torch::Tensor& allowed, const torch::Tensor& age_days);

 private:
  // The feed-forward residual branch, drop(ff2(gelu(ff1(ln_ff(x))))).
  torch::Tensor mlp_branch(const torch::Tensor& x);
  lockstep::numerics::LayerCheckpointing checkpoint_;
  torch::nn::LayerNorm ln_q_{nullptr}, ln_kv_{nullptr}, ln_ff_{nullptr};
  CtsmAttention attn_{nullptr};
  torch::nn::Linear ff1_{nullptr}, ff2_{nullptr};
  lockstep::numerics::Dropout drop_{nullptr};  // its masks are kept by a checkpoint, not redrawn
};
TORCH_MODULE(CtsmLayer);

}  // namespace ctsm
