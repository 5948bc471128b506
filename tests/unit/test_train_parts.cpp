// Trainer building blocks: histogram AUC, lr schedule, TFRecord CRC, atomic checkpoints.
#include <lockstep/train/backtest_metrics.h>
#include <lockstep/train/checkpoint_store.h>
#include <lockstep/train/lr_schedule.h>
#include <lockstep/train/tensorboard_writer.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

using namespace lockstep;
using namespace lockstep::train;

TEST(TrainParts, HistogramAucMatchesExactAuc) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0, 1);
  const int B = 200, L = 8;
  models::CtsmBatch b;
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

TEST(TrainParts, WarmupCosine) {
  LrSchedule s(1.0, 10, 110, 0.1);
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(109), 0.1, 1e-12);
  EXPECT_GT(s.lr(50), s.lr(80));
}

TEST(TrainParts, Crc32cKnownVector) {
  EXPECT_EQ(TensorBoardWriter::crc32c("123456789", 9), 0xE3069283u);
}

TEST(TrainParts, CheckpointLatestAndPrune) {
  const std::string d = (std::filesystem::temp_directory_path() / ("lockstep_ckpt_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(d);
  CheckpointStore store(d, nullptr, 2);
  EXPECT_FALSE(store.latest());
  for (int s : {10, 20, 30}) store.save(s, {{"meta.json", std::to_string(s)}}, {{"rng-rank-0.pt", "r"}});
  ASSERT_TRUE(store.latest());
  EXPECT_EQ(*store.latest(), d + "/step-00000030");
  EXPECT_FALSE(std::filesystem::exists(d + "/step-00000010"));
  EXPECT_TRUE(std::filesystem::exists(d + "/step-00000020/meta.json"));
  // A crash mid-save leaves a .tmp directory that LATEST never names.
  std::filesystem::create_directories(d + "/step-00000040.tmp");
  EXPECT_EQ(*store.latest(), d + "/step-00000030");
}
