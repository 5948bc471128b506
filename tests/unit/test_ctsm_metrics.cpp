// The backtest metrics: the histogram AUC combined over ranks matches the exact AUC.
#include <ctsm/backtest_metrics.h>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace ctsm;

TEST(CtsmMetrics, HistogramAucMatchesExactAuc) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 1);
  const int B = 200, L = 8;
  CtsmBatch b;
  b.is_target = torch::ones({B, L}, torch::kBool);
  b.label = torch::zeros({B, L});
  b.p_true = torch::zeros({B, L});
  auto logits = torch::zeros({B, L});
  std::vector<std::pair<float, int>> all;
  for (int i = 0; i < B; ++i)
    for (int j = 0; j < L; ++j) {
      const int y = n(rng) > 0;
      const float z = n(rng) + 0.8f * y;
      b.label[i][j] = float(y);
      logits[i][j] = z;
      b.p_true[i][j] = 1.f / (1.f + std::exp(-z));
      all.push_back({z, y});
    }
  // exact AUC by counting pairs
  double pairs = 0, good = 0;
  for (auto& a : all)
    for (auto& c : all)
      if (a.second == 1 && c.second == 0) {
        pairs += 1;
        good += a.first > c.first ? 1 : a.first == c.first ? 0.5 : 0;
      }
  BacktestMetrics m(4096, 3);
  m.add(logits, b);
  const auto r = m.reduce(nullptr);
  EXPECT_NEAR(r.auc, good / pairs, 2e-3);
  EXPECT_NEAR(r.oracle_auc, r.auc, 1e-9);  // p_true = model probabilities here
  EXPECT_EQ(r.clients, B);
  EXPECT_GT(r.recall_at_k, 0.3);
}
