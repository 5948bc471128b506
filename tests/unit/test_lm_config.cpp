// The lm workload's config: the shipped configs load; its keys are checked by the trainer's
// schema (a typo names the key, the line and the known keys); the gate reads perplexity as
// lower-is-better with thresholds in [1, 256].
#include <lm/workload.h>

#include <lockstep/train/config.h>

#include <gtest/gtest.h>

using namespace lockstep::train;

namespace {

WorkloadRegistry registry() {
  WorkloadRegistry r;
  lm::register_workload(r);
  return r;
}

const lm::LmConfig& lm_of(const LoadedConfig& l) {
  return dynamic_cast<const lm::LmWorkload&>(*l.workload).config();
}

std::string error_of(const std::string& text, std::vector<std::string> ov = {}) {
  try {
    parse_config(text, "c.toml", registry(), ov);
  } catch (const lockstep::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LmConfig, ShippedConfigsLoad) {
  for (const char* name : {"lm-fsdp", "lm-tiny"}) {
    const LoadedConfig l =
        load_config(std::string(LOCKSTEP_SOURCE_DIR) + "/configs/" + name + ".toml", registry());
    EXPECT_EQ(l.config.run.workload, "lm");
    EXPECT_EQ(l.config.strategy.kind, "fsdp") << name;
    EXPECT_EQ(l.config.strategy.param_dtype, "bfloat16") << name;
    EXPECT_TRUE(l.config.memory.activation_checkpointing) << name;
    EXPECT_EQ(l.config.eval.metric, "perplexity");
    EXPECT_TRUE(l.config.eval.lower_is_better);
    EXPECT_GT(l.config.eval.threshold, 1.0);
    EXPECT_TRUE(lm_of(l).data.corpus.empty()) << name << ": trains on the KJV";
  }
}

TEST(LmConfig, Defaults) {
  const LoadedConfig l = parse_config("[eval]\nthreshold = 8\n", "c.toml", registry());
  EXPECT_EQ(l.config.run.name, "lm");
  EXPECT_EQ(lm_of(l).model.context, 128);
  EXPECT_EQ(lm_of(l).model_options().vocab, 256);
  EXPECT_EQ(lm_of(l).data.block_lines, 50);
  EXPECT_EQ(lm_of(l).split_options().seed, 11u);
  EXPECT_EQ(lm_of(l).eval.sample_prompt, "And God said");
}

TEST(LmConfig, TypoNamesTheKeyTheLineAndTheKnownKeys) {
  const std::string m = error_of("[eval]\nthreshold = 8\n\n[model]\nlayers = 2\nd_modle = 64\n");
  EXPECT_NE(m.find("c.toml:6:"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown key 'model.d_modle'"), std::string::npos) << m;
  EXPECT_NE(m.find("d_model"), std::string::npos) << m;  // among the known keys
  const std::string t = error_of("[eval]\nthreshold = 8\n[data]\nheldout_fraction = 0.9\n");
  EXPECT_NE(t.find("'data.heldout_fraction' = 0.9 is out of range"), std::string::npos) << t;
}

TEST(LmConfig, CrossKeyChecks) {
  EXPECT_NE(error_of("[eval]\nthreshold = 8\n[model]\nd_model = 30\nheads = 4\n")
                .find("c.toml: model.d_model (30) must be divisible by model.heads (4)"),
            std::string::npos);
  EXPECT_NE(error_of("[eval]\nthreshold = 8\nsample_prompt = \"\"\n").find("eval.sample_prompt"),
            std::string::npos);
}

TEST(LmConfig, GateIsLowerIsBetterWithItsOwnRange) {
  // The trainer's default threshold (0.7) is no perplexity: the error says to set one.
  std::string m = error_of("");
  EXPECT_NE(m.find("c.toml: key 'eval.threshold' = 0.7 (the default) is out of range [1, 256] "
                   "for eval.metric 'perplexity' (lower is better): set eval.threshold"),
            std::string::npos)
      << m;
  m = error_of("[eval]\nthreshold = 0.5\n");
  EXPECT_NE(m.find("c.toml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("is out of range [1, 256]"), std::string::npos) << m;
  m = error_of("[eval]\nmetric = \"bits_per_byte\"\nthreshold = 9\n");
  EXPECT_NE(m.find("out of range [0, 8] for eval.metric 'bits_per_byte'"), std::string::npos) << m;
  const LoadedConfig l =
      parse_config("[eval]\nmetric = \"bits_per_byte\"\nthreshold = 2.5\n", "c.toml", registry());
  EXPECT_TRUE(l.config.eval.lower_is_better);
  EXPECT_EQ(l.config.eval.threshold, 2.5);
}
