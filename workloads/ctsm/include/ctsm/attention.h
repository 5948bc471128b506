// ctsm/attention.h: multi-head attention over strictly earlier events.
//
// Written with matmuls rather than torch::nn::MultiheadAttention (absent from libtorch
// 1.13's C++ API) because CTSM needs three things that module does not give: queries and
// keys/values from different streams (keys carry an event's outcome, queries must not),
// a learned "start" key/value that every query may attend to (so a query with no earlier
// event still has a well-defined softmax instead of NaN), and a learned per-head recency
// bias -slope * log1p(days between query and key) that lets heads prefer recent events.
#pragma once

#include <torch/torch.h>

#include <lockstep/numerics/dropout.h>

namespace ctsm {

struct CtsmAttentionOptions {
  int64_t d_model = 64;
  int64_t heads = 4;
  double dropout = 0.0;
};

class CtsmAttentionImpl : public torch::nn::Module {
 public:
  explicit CtsmAttentionImpl(CtsmAttentionOptions o);
  // q_in: [B,L,D] query stream; kv_in: [B,L,D] key/value stream; allowed: [B,L,L] bool
  // (query j may see key i); age_days: [B,L,L] float >= 0 (query time - key time).
  // Returns [B,L,D]. Column "start" is always allowed.
  torch::Tensor forward(const torch::Tensor& q_in, const torch::Tensor& kv_in,
                        const torch::Tensor& allowed, const torch::Tensor& age_days);

 private:
  CtsmAttentionOptions o_;
  torch::nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
  torch::Tensor start_k_, start_v_, recency_slope_;
  lockstep::numerics::Dropout drop_{nullptr};  // torch's dropout, whose mask a checkpoint keeps
};
TORCH_MODULE(CtsmAttention);

}  // namespace ctsm
