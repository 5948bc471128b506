// Schema errors name the key and the file line; overrides go through the same schema.
#include <lockstep/train/config.h>

#include <gtest/gtest.h>

using namespace lockstep::train;

namespace {
std::string error_of(const std::string& text, std::vector<std::string> ov = {}) {
  try {
    parse_config(text, "test.toml", ov);
  } catch (const lockstep::ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TrainConfig, Defaults) {
  const TrainConfig c = parse_config("[optim]\nlr = 0.01\n", "test.toml");
  EXPECT_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_EQ(c.checkpoint.dir, c.run.out_dir + "/checkpoints");
}

TEST(TrainConfig, UnknownKeyNamesKeyAndLine) {
  const std::string m = error_of("[optim]\nlr = 0.01\nlearning_rate = 3\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("'optim.learning_rate'"), std::string::npos) << m;
  EXPECT_NE(m.find("known keys in [optim]"), std::string::npos) << m;
}

TEST(TrainConfig, UnknownSection) {
  const std::string m = error_of("[run]\nname = \"x\"\n\n[optimizer]\nlr = 1.0\n");
  EXPECT_NE(m.find("test.toml:4:"), std::string::npos) << m;
  EXPECT_NE(m.find("'optimizer'"), std::string::npos) << m;
}

TEST(TrainConfig, WrongTypeNamesKeyAndLine) {
  const std::string m = error_of("[train]\nepochs = 2\nbatch_size = \"64\"\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("'train.batch_size' must be an integer, got a string"), std::string::npos) << m;
  const std::string f = error_of("[train]\nepochs = 2.5\n");
  EXPECT_NE(f.find("test.toml:2:"), std::string::npos) << f;
  EXPECT_NE(f.find("'train.epochs'"), std::string::npos) << f;
}

TEST(TrainConfig, BadEnumAndRange) {
  EXPECT_NE(error_of("[optim]\nname = \"adam\"\n").find("is not one of: sgd, adamw"), std::string::npos);
  EXPECT_NE(error_of("[train]\n\nbatch_size = 0\n").find("test.toml:3:"), std::string::npos);
}

TEST(TrainConfig, Overrides) {
  const TrainConfig c = parse_config("[optim]\nlr = 0.01\n", "test.toml",
                                     {"optim.lr=0.5", "run.out_dir=/tmp/x", "strategy.comm_hook=bf16"});
  EXPECT_EQ(c.optim.lr, 0.5);
  EXPECT_EQ(c.run.out_dir, "/tmp/x");
  EXPECT_EQ(c.strategy.comm_hook, "bf16");
  const std::string m = error_of("", {"optim.lrr=1"});
  EXPECT_NE(m.find("--set optim.lrr=1"), std::string::npos) << m;
  EXPECT_NE(error_of("", {"train.epochs=many"}).find("'train.epochs' must be an integer"), std::string::npos);
}

TEST(TrainConfig, SyntaxErrorHasLine) {
  const std::string m = error_of("[run]\nname = \n");
  EXPECT_NE(m.find("test.toml:2:"), std::string::npos) << m;
}
