// Trainer building blocks: lr schedule, TFRecord CRC, atomic checkpoints.
#include <lockstep/train/checkpoint_store.h>

#include "train/loop/lr_schedule.h"
#include "train/report/tensorboard_writer.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace lockstep::train;

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
  const std::string d =
      (std::filesystem::temp_directory_path() / ("lockstep_ckpt_" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(d);
  CheckpointStore store(d, nullptr, 2);
  EXPECT_FALSE(store.latest());
  const std::string meta = R"({"format": "lockstep-checkpoint"})";
  for (int s : {10, 20, 30})
    store.save(s, meta, {{"model.pt", std::to_string(s)}}, {{"rng-rank-0.pt", "r"}});
  ASSERT_TRUE(store.latest());
  EXPECT_EQ(*store.latest(), d + "/step-00000030");
  EXPECT_FALSE(std::filesystem::exists(d + "/step-00000010"));
  EXPECT_TRUE(std::filesystem::exists(d + "/step-00000020/meta.json"));
  // A crash mid-save leaves a .tmp directory that LATEST never names.
  std::filesystem::create_directories(d + "/step-00000040.tmp");
  EXPECT_EQ(*store.latest(), d + "/step-00000030");
  std::filesystem::remove_all(d);
}
