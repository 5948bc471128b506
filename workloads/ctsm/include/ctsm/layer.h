// ctsm/layer.h: one pre-norm encoder layer of CTSM.
//
// Two streams: h (per position, never containing that position's own outcome) and the
// outcome embedding o (event type + feedback), which is added only on the key/value side.
// Because a query sees only keys strictly earlier in time, no position can read its own
// label, nor the labels of items shipped at the same moment.
#pragma once

#include <ctsm/attention.h>

#include <vector>

namespace ctsm {

struct CtsmLayerOptions {
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t d_ff = 256;
  double dropout = 0.0;
  // Recompute the layer's activations in backward instead of keeping them
  // (lockstep::checkpoint; the trainer's memory.activation_checkpointing).
  bool checkpoint = false;
};

class CtsmLayerImpl : public torch::nn::Module {
 public:
  explicit CtsmLayerImpl(CtsmLayerOptions o);
  // h, outcome: [B,L,D]; allowed [B,L,L] bool; age_days [B,L,L].
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& outcome,
                        const torch::Tensor& allowed, const torch::Tensor& age_days);

 private:
  torch::Tensor body(const torch::Tensor& h, const torch::Tensor& outcome,
                     const torch::Tensor& allowed, const torch::Tensor& age_days);
  bool checkpoint_ = false;
  torch::nn::LayerNorm ln_q_{nullptr}, ln_kv_{nullptr}, ln_ff_{nullptr};
  CtsmAttention attn_{nullptr};
  torch::nn::Linear ff1_{nullptr}, ff2_{nullptr};
  torch::nn::Dropout drop_{nullptr};
};
TORCH_MODULE(CtsmLayer);

}  // namespace ctsm
