#include "fsdp_model.h"

#include <cmath>
#include <limits>
#include <string>

namespace lockstep::bench {
namespace {

namespace F = torch::nn::functional;

// 32-bit FNV-1a, as pytorch_fsdp.py computes it.
int64_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return static_cast<int64_t>(h);
}

// Uniform in [0, 1) from the index: Knuth's multiplicative hash mod 2^32 (exact in int64).
at::Tensor hash_uniform(int64_t n, int64_t seed) {
  const auto idx = torch::arange(n, torch::kLong);
  const auto h = (idx * int64_t{2654435761} + seed).remainder(int64_t{4294967296});
  return h.to(torch::kDouble) / 4294967296.0;
}

}  // namespace

int64_t ModelShape::block_params() const { return 12 * d_model * d_model + 13 * d_model; }

int64_t ModelShape::total_params() const {
  return layers * block_params() + 2 * vocab * d_model + seq * d_model + 2 * d_model;
}

std::string ModelShape::flags() const {
  return " --d-model " + std::to_string(d_model) + " --layers " + std::to_string(layers) +
         " --seq " + std::to_string(seq) + " --vocab " + std::to_string(vocab) + " --batch " +
         std::to_string(batch);
}

BlockImpl::BlockImpl(int64_t d, int64_t heads, std::shared_ptr<Probe> probe)
    : heads_(heads), probe_(std::move(probe)) {
  using torch::nn::LayerNormOptions;
  ln1 = register_module("ln1", torch::nn::LayerNorm(LayerNormOptions({d})));
  qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
  proj = register_module("proj", torch::nn::Linear(d, d));
  ln2 = register_module("ln2", torch::nn::LayerNorm(LayerNormOptions({d})));
  fc1 = register_module("fc1", torch::nn::Linear(d, 4 * d));
  fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
}

at::Tensor BlockImpl::attention(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2), dh = d / heads_;
  const auto parts = qkv(x).split(d, -1);
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, heads_, dh}).transpose(1, 2); };
  const auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(dh)));
  const auto future = torch::ones({T, T}, torch::kBool).triu(1);
  att = F::softmax(att.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  return proj(torch::matmul(att, v).transpose(1, 2).reshape({B, T, d}));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  auto h = x + attention(ln1(x));
  h = h + fc2(F::gelu(fc1(ln2(h))));
  if (probe_ && *probe_) {
    (*probe_)();  // the unit's parameters are gathered here
    if (x.requires_grad())
      x.register_hook([p = probe_](const at::Tensor&) {
        if (*p) (*p)();
      });
  }
  return h;
}

TransformerLM::TransformerLM(const ModelShape& s, const std::shared_ptr<Probe>& probe) {
  tok = register_module("tok", torch::nn::Embedding(s.vocab, s.d_model));
  pos = register_parameter("pos", torch::zeros({s.seq, s.d_model}));
  for (int64_t i = 0; i < s.layers; ++i)
    blocks.emplace_back(
        register_module("block" + std::to_string(i),
                        fsdp::wrap(std::make_shared<BlockImpl>(s.d_model, s.heads(), probe))));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.d_model})));
  head = register_module(
      "head", torch::nn::Linear(torch::nn::LinearOptions(s.d_model, s.vocab).bias(false)));
}

at::Tensor TransformerLM::forward(const at::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  auto x = tok(tokens) + pos.narrow(0, 0, T);
  for (auto& b : blocks) x = b(x);
  return head(ln_f(x)).view({-1, head->options.out_features()});
}

void init_deterministic(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor p = item.value();
    if (p.dim() == 1) {  // LayerNorm weights 1, every bias 0
      p.fill_(name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0 ? 1.0 : 0.0);
      continue;
    }
    const bool embedding = name == "pos" || name.rfind("tok.", 0) == 0;
    const double bound = embedding ? 0.05 : 1.0 / std::sqrt(double(p.size(1)));
    const auto u = hash_uniform(p.numel(), fnv1a(name));
    p.copy_(((u * 2 - 1) * bound).to(p.scalar_type()).view(p.sizes()));
  }
}

std::pair<at::Tensor, at::Tensor> make_batch(const ModelShape& s, int rank, int k) {
  const int64_t n = s.batch * (s.seq + 1);
  const int64_t seed = 7919LL * (rank + 1) + 104729LL * (k % 4);
  const auto h =
      (torch::arange(n, torch::kLong) * int64_t{2654435761} + seed).remainder(int64_t{4294967296});
  const auto ids = torch::div(h, 256, "floor").remainder(s.vocab).view({s.batch, s.seq + 1});
  return {ids.narrow(1, 0, s.seq).contiguous(), ids.narrow(1, 1, s.seq).reshape({-1})};
}

}  // namespace lockstep::bench
