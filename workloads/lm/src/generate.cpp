#include <lm/generate.h>

#include <lm/tokenizer.h>

#include <lockstep/error.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace lm {
namespace {

int64_t argmax_of(const std::vector<double>& v) {
  int64_t best = 0;
  for (int64_t i = 1; i < int64_t(v.size()); ++i)
    if (v[size_t(i)] > v[size_t(best)]) best = i;
  return best;
}

// A draw from softmax(logits / temperature) by the inverse CDF.
int64_t draw_from(const std::vector<double>& logits, double temperature, std::mt19937_64& rng) {
  double top = logits[0];
  for (double z : logits) top = std::max(top, z);
  std::vector<double> w(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    total += w[i] = std::exp((logits[i] - top) / temperature);
  const double u = double(rng() >> 11) * 0x1.0p-53 * total;  // uniform in [0, total)
  double acc = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if ((acc += w[i]) > u) return int64_t(i);
  return argmax_of(logits);  // rounding left u at the very top
}

}  // namespace

std::string generate(LmImpl& model, const std::string& prompt, const SampleOptions& o) {
  LOCKSTEP_CHECK(!prompt.empty(), "lm::generate: the prompt is empty");
  torch::NoGradGuard ng;
  std::mt19937_64 rng(o.seed);
  std::vector<int64_t> tokens = ByteTokenizer::encode(prompt);
  const size_t prompt_len = tokens.size();
  const int64_t context = model.options().context;
  for (int64_t step = 0; step < o.tokens; ++step) {
    const int64_t n = std::min<int64_t>(int64_t(tokens.size()), context);
    auto input = torch::tensor(std::vector<int64_t>(tokens.end() - n, tokens.end()), torch::kInt64)
                     .view({1, n});
    auto last = model.forward(input)[0][n - 1].to(torch::kFloat64).contiguous();
    std::vector<double> logits(last.data_ptr<double>(), last.data_ptr<double>() + last.numel());
    tokens.push_back(o.temperature <= 0 ? argmax_of(logits)
                                        : draw_from(logits, o.temperature, rng));
  }
  return ByteTokenizer::decode(
      std::vector<int64_t>(tokens.begin() + std::ptrdiff_t(prompt_len), tokens.end()));
}

}  // namespace lm
