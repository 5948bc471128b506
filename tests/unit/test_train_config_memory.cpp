// [memory]: the selective activation checkpointing keys (docs/trainer.md): defaults, set
// values, a bad value or a typo naming the key and its line, and the keys that need
// memory.activation_checkpointing = true.
#include <lockstep/train/config.h>
#include <lockstep/train/config_schema.h>

#include <gtest/gtest.h>

using namespace lockstep::train;

namespace {

// The smallest workload the parser accepts: [memory] is the trainer's own section.
class NoKeysWorkload : public Workload {
 public:
  void declare_config(ConfigSchema&) override {}
  std::vector<std::string> gate_metrics() const override { return {"accuracy"}; }
  void prepare_data(const RunContext&) override {}
  std::vector<int64_t> examples_per_rank(const RunContext& ctx) override {
    return std::vector<int64_t>(ctx.world, 1);
  }
  std::shared_ptr<torch::nn::Module> build_model(const RunContext&) override { return nullptr; }
  std::string model_name() const override { return "none"; }
  std::unique_ptr<BatchStream> train_batches(const RunContext&) override { return nullptr; }
  torch::Tensor loss(const Batch&) override { return {}; }
  EvalResult evaluate(const RunContext&) override { return {}; }
  ExportResult export_model(const ExportInfo&) override { return {}; }
};

MemoryConfig parse_memory(const std::string& text, const std::vector<std::string>& ov = {}) {
  WorkloadRegistry r;
  r.add("none", [] { return std::make_unique<NoKeysWorkload>(); });
  return parse_config(text, "test.toml", r, ov).config.memory;
}

std::string memory_error_of(const std::string& text, const std::vector<std::string>& ov = {}) {
  try {
    parse_memory(text, ov);
  } catch (const lockstep::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfigMemory, DefaultsCheckpointWholeLayersKeepingMasks) {
  const MemoryConfig m = parse_memory("[memory]\nactivation_checkpointing = true\n");
  EXPECT_TRUE(m.activation_checkpointing);
  EXPECT_EQ(m.checkpoint_every, 1);
  EXPECT_EQ(m.checkpoint_blocks, "layer");
  EXPECT_TRUE(m.keep_dropout_masks);
  EXPECT_FALSE(parse_memory("").activation_checkpointing);
}

TEST(TrainConfigMemory, SelectiveKeysAreSet) {
  const MemoryConfig m = parse_memory(
      "[memory]\nactivation_checkpointing = true\ncheckpoint_every = 3\n"
      "checkpoint_blocks = \"attention\"\nkeep_dropout_masks = false\n");
  EXPECT_EQ(m.checkpoint_every, 3);
  EXPECT_EQ(m.checkpoint_blocks, "attention");
  EXPECT_FALSE(m.keep_dropout_masks);
  const MemoryConfig o =
      parse_memory("", {"memory.activation_checkpointing=true", "memory.checkpoint_blocks=mlp",
                        "memory.checkpoint_every=2"});
  EXPECT_EQ(o.checkpoint_blocks, "mlp");
  EXPECT_EQ(o.checkpoint_every, 2);
}

TEST(TrainConfigMemory, BadValuesAndTyposNameTheKey) {
  const std::string on = "[memory]\nactivation_checkpointing = true\n";
  std::string m = memory_error_of(on + "checkpoint_blocks = \"attn\"\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'memory.checkpoint_blocks' = 'attn' is not one of: layer, attention, mlp"),
            std::string::npos)
      << m;
  m = memory_error_of(on + "checkpoint_every = 0\n");
  EXPECT_NE(m.find("key 'memory.checkpoint_every' = 0 is out of range [1, inf]"), std::string::npos)
      << m;
  m = memory_error_of(on + "checkpoint_every = \"2\"\n");
  EXPECT_NE(m.find("'memory.checkpoint_every' must be an integer, got a string"), std::string::npos)
      << m;
  m = memory_error_of(on + "checkpoint_evry = 2\n");
  EXPECT_NE(m.find("test.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown key 'memory.checkpoint_evry'"), std::string::npos) << m;
  EXPECT_NE(m.find("checkpoint_blocks, checkpoint_every"), std::string::npos) << m;  // known keys
}

TEST(TrainConfigMemory, SelectiveKeysNeedCheckpointingOn) {
  std::string m = memory_error_of("[memory]\ncheckpoint_every = 2\n");
  EXPECT_NE(m.find("test.toml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'memory.checkpoint_every' needs memory.activation_checkpointing = true"),
            std::string::npos)
      << m;
  m = memory_error_of("", {"memory.keep_dropout_masks=false"});
  EXPECT_NE(m.find("--set memory.keep_dropout_masks=false"), std::string::npos) << m;
  EXPECT_NE(m.find("needs memory.activation_checkpointing = true"), std::string::npos) << m;
}

}  // namespace
