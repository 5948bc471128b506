#include <ctsm/backtest_metrics.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ctsm {
namespace {

double histogram_auc(const double* pos, const double* neg, int64_t bins) {
  double p_total = 0, n_total = 0, area = 0, neg_below = 0;
  for (int64_t b = 0; b < bins; ++b) {
    area += pos[b] * (neg_below + 0.5 * neg[b]);
    neg_below += neg[b];
    p_total += pos[b];
    n_total += neg[b];
  }
  return p_total > 0 && n_total > 0 ? area / (p_total * n_total) : 0.5;
}

// Kept items among the top-k scores of one client's candidates.
int64_t top_k_hits(std::vector<std::pair<float, bool>>& scored, int64_t k) {
  std::stable_sort(scored.begin(), scored.end(),
                   [](auto& a, auto& b) { return a.first > b.first; });
  int64_t hits = 0;
  for (int64_t i = 0; i < std::min<int64_t>(k, int64_t(scored.size())); ++i)
    hits += scored[i].second;
  return hits;
}

}  // namespace

BacktestMetrics::BacktestMetrics(int64_t bins, int64_t k)
    : bins_(bins), k_(k), hist_(torch::zeros({4, bins}, torch::kFloat64)) {}

void BacktestMetrics::add(const torch::Tensor& logits, const CtsmBatch& batch) {
  auto prob = torch::sigmoid(logits.detach().to(torch::kFloat32)).contiguous();
  auto lg = logits.detach().to(torch::kFloat32).contiguous();
  auto p = prob.accessor<float, 2>();
  auto z = lg.accessor<float, 2>();
  auto tgt = batch.is_target.accessor<bool, 2>();
  auto lab = batch.label.accessor<float, 2>();
  auto pt = batch.p_true.accessor<float, 2>();
  auto h = hist_.accessor<double, 2>();
  auto bin = [&](float x) {
    return std::clamp<int64_t>(int64_t(double(x) * double(bins_)), 0, bins_ - 1);
  };
  std::vector<std::pair<float, bool>> model, oracle;
  for (int64_t i = 0; i < p.size(0); ++i) {
    model.clear();
    oracle.clear();
    int64_t kept = 0;
    for (int64_t j = 0; j < p.size(1); ++j) {
      if (!tgt[i][j]) continue;
      const bool y = lab[i][j] > 0.5f;
      h[y ? 0 : 1][bin(p[i][j])] += 1;
      h[y ? 2 : 3][bin(pt[i][j])] += 1;
      // log loss from the logit, stable for large |z|
      sums_[0] +=
          std::max(z[i][j], 0.f) - z[i][j] * float(y) + std::log1p(std::exp(-std::abs(z[i][j])));
      model.push_back({p[i][j], y});
      oracle.push_back({pt[i][j], y});
      kept += y;
    }
    if (model.empty()) continue;
    sums_[4] += 1;
    if (kept == 0) continue;  // recall is undefined for a client who kept nothing
    sums_[1] += double(top_k_hits(model, k_));
    sums_[2] += double(std::min(k_, kept));
    sums_[3] += double(top_k_hits(oracle, k_));
  }
}

BacktestResult BacktestMetrics::reduce(lockstep::comm::ProcessGroup* group) const {
  auto all = torch::cat(
      {hist_.flatten(), torch::tensor(std::vector<double>(sums_, sums_ + 5), torch::kFloat64)});
  if (group && group->size() > 1) group->allreduce(all)->wait();
  auto a = all.accessor<double, 1>();
  const double* base = all.data_ptr<double>();
  BacktestResult r;
  r.auc = histogram_auc(base, base + bins_, bins_);
  r.oracle_auc = histogram_auc(base + 2 * bins_, base + 3 * bins_, bins_);
  const double* s = base + 4 * bins_;
  for (int64_t b = 0; b < bins_; ++b) {
    r.positives += int64_t(a[b]);
    r.negatives += int64_t(a[bins_ + b]);
  }
  const double n = double(r.positives + r.negatives);
  r.logloss = n > 0 ? s[0] / n : 0;
  r.recall_at_k = s[2] > 0 ? s[1] / s[2] : 0;
  r.oracle_recall_at_k = s[2] > 0 ? s[3] / s[2] : 0;
  r.clients = int64_t(s[4]);
  return r;
}

}  // namespace ctsm
