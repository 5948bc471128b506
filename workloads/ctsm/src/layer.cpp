#include <ctsm/layer.h>

namespace ctsm {

CtsmLayerImpl::CtsmLayerImpl(CtsmLayerOptions o) : checkpoint_(o.checkpoint) {
  ln_q_ = register_module("ln_q", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  ln_kv_ = register_module("ln_kv", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  ln_ff_ = register_module("ln_ff", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  attn_ =
      register_module("attn", CtsmAttention(CtsmAttentionOptions{o.d_model, o.heads, o.dropout}));
  ff1_ = register_module("ff1", torch::nn::Linear(o.d_model, o.d_ff));
  ff2_ = register_module("ff2", torch::nn::Linear(o.d_ff, o.d_model));
  drop_ = register_module("drop", lockstep::numerics::Dropout(o.dropout));
}

// x = h + drop(attn(ln_q(h), ln_kv(h + outcome))), y = x + drop(ff2(gelu(ff1(ln_ff(x))))),
// with the checkpoints of the layer's plan. They run inside the layer, so inside its FSDP
// unit: a recomputation finds the unit's parameters gathered by FSDP's pre-backward hook.
torch::Tensor CtsmLayerImpl::forward(const torch::Tensor& h, const torch::Tensor& outcome,
                                     const torch::Tensor& allowed, const torch::Tensor& age_days) {
  lockstep::numerics::ResidualLayer layer;
  // An attention-only checkpoint takes h + outcome as its input: h then enters it once
  // (ln_q), so the gradient of h sums its three parts (residual, ln_q, ln_kv) outside the
  // checkpoint in the plain model's order, and the result stays bit-identical.
  const bool kv_outside = checkpoint_.attention;
  layer.attention = [this, kv_outside](const torch::Tensor& in,
                                       const std::vector<torch::Tensor>& extra) {
    const torch::Tensor kv = kv_outside ? extra[0] : in + extra[0];
    return drop_(attn_(ln_q_(in), ln_kv_(kv), extra[1], extra[2]));
  };
  layer.mlp = [this](const torch::Tensor& x) { return mlp_branch(x); };
  if (checkpoint_.any()) {  // what the checkpoints declare; a plain forward needs none
    using Modules = std::initializer_list<torch::nn::Module*>;
    for (auto* m : Modules{ln_q_.get(), ln_kv_.get(), attn_.get()})
      for (const auto& p : m->parameters()) layer.attention_params.push_back(p);
    for (auto* m : Modules{ln_ff_.get(), ff1_.get(), ff2_.get()})
      for (const auto& p : m->parameters()) layer.mlp_params.push_back(p);
  }
  return lockstep::numerics::run_residual_layer(
      checkpoint_, layer, h, {kv_outside ? h + outcome : outcome, allowed, age_days});
}

torch::Tensor CtsmLayerImpl::mlp_branch(const torch::Tensor& x) {
  return drop_(ff2_(torch::gelu(ff1_(ln_ff_(x)))));
}

}  // namespace ctsm
