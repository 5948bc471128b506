#include <ctsm/layer.h>

#include <lockstep/numerics/checkpoint.h>

namespace ctsm {

CtsmLayerImpl::CtsmLayerImpl(CtsmLayerOptions o) : checkpoint_(o.checkpoint) {
  ln_q_ = register_module("ln_q", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  ln_kv_ = register_module("ln_kv", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  ln_ff_ = register_module("ln_ff", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  attn_ =
      register_module("attn", CtsmAttention(CtsmAttentionOptions{o.d_model, o.heads, o.dropout}));
  ff1_ = register_module("ff1", torch::nn::Linear(o.d_model, o.d_ff));
  ff2_ = register_module("ff2", torch::nn::Linear(o.d_ff, o.d_model));
  drop_ = register_module("drop", torch::nn::Dropout(o.dropout));
}

torch::Tensor CtsmLayerImpl::forward(const torch::Tensor& h, const torch::Tensor& outcome,
                                     const torch::Tensor& allowed, const torch::Tensor& age_days) {
  if (!checkpoint_) return body(h, outcome, allowed, age_days);
  // Inside the layer, so inside its FSDP unit: the recomputation finds the unit's
  // parameters gathered by FSDP's pre-backward hook.
  return lockstep::checkpoint(
      [this](const std::vector<torch::Tensor>& in) {
        return std::vector<torch::Tensor>{body(in[0], in[1], in[2], in[3])};
      },
      {h, outcome, allowed, age_days}, parameters())[0];
}

torch::Tensor CtsmLayerImpl::body(const torch::Tensor& h, const torch::Tensor& outcome,
                                  const torch::Tensor& allowed, const torch::Tensor& age_days) {
  auto x = h + drop_(attn_(ln_q_(h), ln_kv_(h + outcome), allowed, age_days));
  return x + drop_(ff2_(torch::gelu(ff1_(ln_ff_(x)))));
}

}  // namespace ctsm
