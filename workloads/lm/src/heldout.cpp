#include <lm/heldout.h>

#include <lm/batch_stream.h>

#include <algorithm>
#include <vector>

namespace lm {

int64_t heldout_windows(int64_t text_size, int64_t context, int64_t max_tokens) {
  const int64_t all = text_size > context ? (text_size - 1) / context : 0;
  if (max_tokens <= 0) return all;
  return std::min(all, (max_tokens + context - 1) / context);
}

HeldoutLoss heldout_loss(LmImpl& model, const std::string& text, const HeldoutOptions& o) {
  torch::NoGradGuard ng;
  const int64_t T = model.options().context;
  const int64_t n = heldout_windows(int64_t(text.size()), T, o.max_tokens);
  HeldoutLoss out;
  std::vector<int64_t> starts;
  auto flush = [&] {
    if (starts.empty()) return;
    const LmBatch b = window_batch(text, starts, T);
    const auto logits = model.forward(b.input);
    // Summed in float64 over the batch: a float32 sum over 10^5 tokens would lose digits.
    out.nats +=
        torch::nn::functional::cross_entropy(
            logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), b.target.reshape({-1}),
            torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
            .to(torch::kFloat64)
            .sum()
            .item<double>();
    out.tokens += b.target.numel();
    starts.clear();
  };
  for (int64_t w = o.rank; w < n; w += o.world) {
    starts.push_back(w * T);
    if (int64_t(starts.size()) == o.batch_size) flush();
  }
  flush();
  return out;
}

}  // namespace lm
