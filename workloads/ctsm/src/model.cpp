#include <ctsm/model.h>

namespace ctsm {

CtsmImpl::CtsmImpl(CtsmOptions o) : o_(o) {
  const int64_t D = o.d_model;
  item_emb_ = register_module("item_emb", torch::nn::Embedding(o.num_items + 1, D));
  item_bias_ = register_module("item_bias", torch::nn::Embedding(o.num_items + 1, 1));
  kind_emb_ = register_module("kind_emb", torch::nn::Embedding(3, D));  // pad, item, feedback
  type_emb_ =
      register_module("type_emb", torch::nn::Embedding(4, D));  // hidden, keep, return, feedback
  feedback_emb_ = register_module("feedback_emb", torch::nn::Embedding(6, D));  // none, 1..5
  time_proj_ = register_module("time_proj", torch::nn::Linear(kCtsmTimeFeatures, D));
  // Small init keeps the early residual stream dominated by the item identity.
  torch::NoGradGuard ng;
  for (auto* e : {&item_emb_, &kind_emb_, &type_emb_, &feedback_emb_})
    (*e)->weight.normal_(0, 0.05);
  item_bias_->weight.zero_();
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.layers; ++i) {
    layer_ptrs_.push_back(lockstep::fsdp::wrap(
        CtsmLayer(CtsmLayerOptions{D, o.heads, o.d_ff, o.dropout, o.checkpoint.for_layer(i)})));
    layers_->push_back(layer_ptrs_.back());
  }
  ln_out_ = register_module("ln_out", torch::nn::LayerNorm(torch::nn::LayerNormOptions({D})));
  head1_ = register_module("head1", torch::nn::Linear(D, D));
  head2_ = register_module("head2", torch::nn::Linear(D, 1));
  bilinear_ =
      register_module("bilinear", torch::nn::Linear(torch::nn::LinearOptions(D, D).bias(false)));
  taste_proj_ =
      register_module("taste_proj", torch::nn::Linear(torch::nn::LinearOptions(D, D).bias(false)));
}

torch::Tensor CtsmImpl::forward(const CtsmBatch& b) {
  // Query stream: what is known about a position before its outcome.
  auto kind = torch::where(b.item > 0, torch::ones_like(b.item), torch::zeros_like(b.item));
  kind = torch::where(b.time_s < kCtsmPadTime, kind + (b.item == 0).to(torch::kInt64),
                      kind);  // 2 = feedback
  // Outcome stream: added to keys/values only. Besides type and rating embeddings it
  // carries the item embedding signed by the outcome (+ kept, - returned), so even a
  // uniform attention over the history sums to a "taste" vector in item space; without
  // it, taste could only emerge through attention weights, which learns far slower.
  auto item_e = item_emb_(b.item);
  // The parameters' dtype: float32, or e.g. bfloat16 under FSDP's mixed precision, which
  // casts the parameters but not the batch; the float inputs follow the parameters.
  const auto dt = item_e.scalar_type();
  auto sign = (b.type == 1).to(dt) - (b.type == 2).to(dt);
  // The signed term goes through its own map: h already holds item_e, and with a bare
  // sign * item_e a return cancelled it (h + outcome had no item left), so returns, half
  // the evidence about taste, carried no identity at all.
  auto outcome =
      type_emb_(b.type) + feedback_emb_(b.feedback) + sign.unsqueeze(-1) * taste_proj_(item_e);
  auto h = item_e + kind_emb_(kind) + time_proj_(b.time_feat.to(dt));
  // allowed[b,j,i]: key i is context and strictly earlier than query j.
  auto tq = b.time_s.unsqueeze(2), tk = b.time_s.unsqueeze(1);
  auto allowed = b.is_key.unsqueeze(1) & (tk < tq);
  auto age = ((tq - tk).clamp_min(0).to(torch::kFloat32) / 86400.0f).clamp_max(1e4).to(dt);
  for (auto& layer : layer_ptrs_) h = layer(h, outcome, allowed, age);
  auto state = ln_out_(h);
  // MLP score plus a bilinear client-state x item match: the interaction the generator's
  // affinity term has, given directly instead of left for the MLP to approximate.
  auto z = head2_(torch::gelu(head1_(state))).squeeze(-1) + (bilinear_(state) * item_e).sum(-1);
  return z + item_bias_(b.item).squeeze(-1);
}

torch::Tensor CtsmImpl::loss(const torch::Tensor& logits, const CtsmBatch& b) {
  auto w = b.is_target.to(torch::kFloat32);
  auto l = torch::binary_cross_entropy_with_logits(logits.to(torch::kFloat32), b.label, {}, {},
                                                   at::Reduction::None);
  return (l * w).sum() / w.sum().clamp_min(1.0);
}

int64_t count_parameters(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

}  // namespace ctsm
