#include <ctsm/attention.h>

#include <cmath>

namespace ctsm {

CtsmAttentionImpl::CtsmAttentionImpl(CtsmAttentionOptions o) : o_(o) {
  TORCH_CHECK(o.d_model % o.heads == 0, "CTSM: d_model ", o.d_model, " not divisible by heads ",
              o.heads);
  wq_ = register_module("wq", torch::nn::Linear(o.d_model, o.d_model));
  wk_ = register_module("wk", torch::nn::Linear(o.d_model, o.d_model));
  wv_ = register_module("wv", torch::nn::Linear(o.d_model, o.d_model));
  wo_ = register_module("wo", torch::nn::Linear(o.d_model, o.d_model));
  start_k_ = register_parameter("start_k", torch::randn({o.d_model}) * 0.02);
  start_v_ = register_parameter("start_v", torch::randn({o.d_model}) * 0.02);
  // Slopes start spread out (0.1..1) so heads begin with different time horizons.
  recency_slope_ = register_parameter("recency_slope", torch::linspace(0.1, 1.0, o.heads));
  drop_ = register_module("drop", lockstep::numerics::Dropout(o.dropout));
}

torch::Tensor CtsmAttentionImpl::forward(const torch::Tensor& q_in, const torch::Tensor& kv_in,
                                         const torch::Tensor& allowed,
                                         const torch::Tensor& age_days) {
  const int64_t B = q_in.size(0), L = q_in.size(1), H = o_.heads, Dh = o_.d_model / o_.heads;
  auto heads = [&](const torch::Tensor& x, int64_t n) {
    return x.view({B, n, H, Dh}).transpose(1, 2);
  };
  // Keys/values: the start token first, then the events.
  auto kv_k = torch::cat({wk_(start_k_).expand({B, 1, o_.d_model}), wk_(kv_in)}, 1);
  auto kv_v = torch::cat({wv_(start_v_).expand({B, 1, o_.d_model}), wv_(kv_in)}, 1);
  auto q = heads(wq_(q_in), L);  // [B,H,L,Dh]
  auto k = heads(kv_k, L + 1);   // [B,H,L+1,Dh]
  auto v = heads(kv_v, L + 1);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(Dh));  // [B,H,L,L+1]
  // Recency bias on the event columns; the start column gets none.
  auto bias =
      -recency_slope_.view({1, H, 1, 1}) * torch::log1p(age_days).unsqueeze(1);  // [B,H,L,L]
  bias = torch::cat({torch::zeros({B, H, L, 1}, bias.options()), bias}, -1);
  auto mask = torch::cat({torch::ones({B, L, 1}, allowed.options()), allowed}, -1).unsqueeze(1);
  scores = (scores + bias).masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  auto attn = drop_(torch::softmax(scores, -1));
  auto out = torch::matmul(attn, v).transpose(1, 2).reshape({B, L, o_.d_model});
  return wo_(out);
}

}  // namespace ctsm
