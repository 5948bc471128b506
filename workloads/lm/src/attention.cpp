#include <lm/attention.h>

#include <cmath>
#include <limits>

namespace lm {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(CausalSelfAttentionOptions o) : o_(o) {
  TORCH_CHECK(o.d_model % o.heads == 0, "lm: d_model ", o.d_model, " not divisible by heads ",
              o.heads);
  qkv_ = register_module("qkv", torch::nn::Linear(o.d_model, 3 * o.d_model));
  proj_ = register_module("proj", torch::nn::Linear(o.d_model, o.d_model));
  drop_ = register_module("drop", lockstep::numerics::Dropout(o.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = o_.heads, Dh = o_.d_model / o_.heads;
  auto qkv = qkv_(x).view({B, T, 3, H, Dh}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, Dh]
  auto q = qkv[0].reshape({B * H, T, Dh}), k = qkv[1].reshape({B * H, T, Dh}),
       v = qkv[2].reshape({B * H, T, Dh});
  // 0 on and below the diagonal, -inf above it (key s > query t): exp(-inf) is exactly 0.
  auto later = torch::full({T, T}, -std::numeric_limits<float>::infinity(), q.options()).triu(1);
  // scores = later + q k^T / sqrt(Dh) in one op: no separate scaling or masking pass over
  // the [B H, T, T] scores, and no masked_fill in backward.
  auto scores = torch::baddbmm(later, q, k.transpose(1, 2), 1.0, 1.0 / std::sqrt(double(Dh)));
  auto weights = drop_(torch::softmax(scores, -1));
  auto out = torch::bmm(weights, v).view({B, H, T, Dh}).transpose(1, 2).reshape({B, T, o_.d_model});
  return proj_(out);
}

}  // namespace lm
