#include <lm/block.h>

#include <initializer_list>
#include <vector>

namespace lm {

torch::Tensor layer_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  if (x.scalar_type() != torch::kBFloat16) return ln->forward(x);
  const auto& o = ln->options;
  const auto f32 = torch::kFloat32;
  return torch::layer_norm(x.to(f32), o.normalized_shape(), ln->weight.to(f32), ln->bias.to(f32),
                           o.eps())
      .to(x.scalar_type());
}

BlockImpl::BlockImpl(BlockOptions o) : checkpoint_(o.checkpoint) {
  const auto norm = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})); };
  ln1_ = register_module("ln1", norm());
  attn_ = register_module(
      "attn", CausalSelfAttention(CausalSelfAttentionOptions{o.d_model, o.heads, o.dropout}));
  ln2_ = register_module("ln2", norm());
  fc1_ = register_module("fc1", torch::nn::Linear(o.d_model, o.d_ff));
  fc2_ = register_module("fc2", torch::nn::Linear(o.d_ff, o.d_model));
  drop_ = register_module("drop", lockstep::numerics::Dropout(o.dropout));
}

torch::Tensor BlockImpl::attention_branch(const torch::Tensor& h) {
  return drop_(attn_(layer_norm(ln1_, h)));
}

torch::Tensor BlockImpl::mlp_branch(const torch::Tensor& x) {
  return drop_(fc2_(torch::gelu(fc1_(layer_norm(ln2_, x)))));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& h) {
  lockstep::numerics::ResidualLayer layer;
  layer.attention = [this](const torch::Tensor& in, const std::vector<torch::Tensor>&) {
    return attention_branch(in);
  };
  layer.mlp = [this](const torch::Tensor& x) { return mlp_branch(x); };
  if (checkpoint_.any()) {  // what the checkpoints declare; a plain forward needs none
    using Modules = std::initializer_list<torch::nn::Module*>;
    for (auto* m : Modules{ln1_.get(), attn_.get()})
      for (const auto& p : m->parameters()) layer.attention_params.push_back(p);
    for (auto* m : Modules{ln2_.get(), fc1_.get(), fc2_.get()})
      for (const auto& p : m->parameters()) layer.mlp_params.push_back(p);
  }
  return lockstep::numerics::run_residual_layer(checkpoint_, layer, h);
}

}  // namespace lm
