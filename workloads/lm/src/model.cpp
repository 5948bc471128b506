#include <lm/model.h>

#include <lockstep/error.h>

#include <cmath>

namespace lm {

LmImpl::LmImpl(LmOptions o) : o_(o) {
  LOCKSTEP_CHECK(o.vocab >= 1 && o.context >= 1 && o.d_model >= 1 && o.layers >= 0,
                 "lm::Lm: vocab ", o.vocab, ", context ", o.context, ", d_model ", o.d_model,
                 ", layers ", o.layers);
  const int64_t D = o.d_model;
  tok_emb_ = register_module("tok_emb", torch::nn::Embedding(o.vocab, D));
  pos_emb_ = register_parameter("pos_emb", torch::zeros({o.context, D}));
  drop_ = register_module("drop", lockstep::numerics::Dropout(o.dropout));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) {
    block_ptrs_.push_back(lockstep::fsdp::wrap(
        Block(BlockOptions{D, o.heads, o.d_ff, o.dropout, o.checkpoint.for_layer(i)})));
    blocks_->push_back(block_ptrs_.back());
  }
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({D})));
  init_weights();
}

void LmImpl::init_weights() {
  torch::NoGradGuard ng;
  tok_emb_->weight.normal_(0, 0.02);
  pos_emb_.normal_(0, 0.02);
  const double residual_std = 0.02 / std::sqrt(2.0 * double(std::max<int64_t>(o_.layers, 1)));
  for (auto& b : block_ptrs_) {
    BlockImpl& block = *b->module();
    for (auto* lin :
         {&block.attention()->qkv(), &block.attention()->proj(), &block.fc1(), &block.fc2()}) {
      (*lin)->weight.normal_(0, 0.02);
      (*lin)->bias.zero_();
    }
    // The two writes into the residual stream.
    block.attention()->proj()->weight.normal_(0, residual_std);
    block.fc2()->weight.normal_(0, residual_std);
  }
}

torch::Tensor LmImpl::forward(const torch::Tensor& tokens) {
  LOCKSTEP_CHECK(tokens.dim() == 2 && tokens.size(1) >= 1 && tokens.size(1) <= o_.context,
                 "lm::Lm: tokens of shape ", tokens.sizes(), "; want [batch, 1..", o_.context, "]");
  const int64_t T = tokens.size(1);
  auto h = drop_(tok_emb_(tokens) + pos_emb_.slice(0, 0, T));
  for (auto& block : block_ptrs_) h = block(h);
  return torch::nn::functional::linear(layer_norm(ln_f_, h), tok_emb_->weight);
}

torch::Tensor LmImpl::loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const int64_t V = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, V}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

int64_t count_parameters(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace lm
