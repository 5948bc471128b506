// The CTSM workload's config sections, checked by the trainer's schema: the shipped
// configs load unchanged, and [data] / [model] / eval.k errors name the key and the line.
#include <ctsm/workload.h>

#include <lockstep/train/config.h>

#include <gtest/gtest.h>

using namespace lockstep::train;

namespace {

WorkloadRegistry registry() {
  WorkloadRegistry r;
  ctsm::register_workload(r);
  return r;
}

const ctsm::CtsmConfig& ctsm_of(const LoadedConfig& l) {
  return dynamic_cast<const ctsm::CtsmWorkload&>(*l.workload).config();
}

std::string error_of(const std::string& text, std::vector<std::string> ov = {}) {
  try {
    parse_config(text, "c.toml", registry(), ov);
  } catch (const lockstep::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(CtsmConfig, ShippedConfigsLoad) {
  const LoadedConfig tiny =
      load_config(std::string(LOCKSTEP_SOURCE_DIR) + "/configs/ctsm-tiny.toml", registry());
  EXPECT_EQ(tiny.config.run.workload, "ctsm");
  EXPECT_EQ(tiny.config.run.name, "ctsm-tiny");
  EXPECT_EQ(tiny.config.eval.metric, "auc");
  EXPECT_EQ(ctsm_of(tiny).data.items, 200);
  EXPECT_EQ(ctsm_of(tiny).model.d_model, 32);
  EXPECT_EQ(ctsm_of(tiny).eval.k, 3);
  EXPECT_EQ(ctsm_of(tiny).eval.bins, 4096);  // default
  const LoadedConfig demo =
      load_config(std::string(LOCKSTEP_SOURCE_DIR) + "/configs/ctsm-demo.toml", registry());
  EXPECT_EQ(demo.config.run.workload, "ctsm");
}

TEST(CtsmConfig, Defaults) {
  const LoadedConfig l = parse_config("", "c.toml", registry());
  EXPECT_EQ(l.config.run.name, "ctsm");
  EXPECT_EQ(l.config.run.out_dir, "out/ctsm");
  EXPECT_EQ(ctsm_of(l).data.dir, "out/data/ctsm");
  EXPECT_EQ(ctsm_of(l).data.clients, 4000);
  EXPECT_EQ(ctsm_of(l).model.heads, 4);
  EXPECT_EQ(ctsm_of(l).generator_options().num_items, 1000u);
  EXPECT_EQ(ctsm_of(l).model_options().num_items, 1000);
}

TEST(CtsmConfig, KeyErrorsNameKeyAndLine) {
  std::string m = error_of("[data]\nclients = 10\nitems = \"many\"\n");
  EXPECT_NE(m.find("c.toml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'data.items' must be an integer, got a string"), std::string::npos) << m;
  m = error_of("[model]\ndropout = 1.5\n");
  EXPECT_NE(m.find("c.toml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("'model.dropout' = 1.5 is out of range"), std::string::npos) << m;
  m = error_of("[model]\nwidth = 3\n");
  EXPECT_NE(m.find("unknown key 'model.width' (known keys in [model]: d_ff, d_model, dropout, "
                   "heads, layers)"),
            std::string::npos)
      << m;
  m = error_of("[eval]\nk = 0\n");
  EXPECT_NE(m.find("c.toml:2:"), std::string::npos) << m;
  EXPECT_NE(m.find("'eval.k' = 0 is out of range"), std::string::npos) << m;
  m = error_of("[eval]\nmetric = \"ndcg\"\n");
  EXPECT_NE(m.find("'eval.metric' = 'ndcg' is not one of: auc, recall_at_k"), std::string::npos)
      << m;
}

TEST(CtsmConfig, CrossKeyChecks) {
  EXPECT_NE(error_of("[model]\nd_model = 30\nheads = 4\n")
                .find("c.toml: model.d_model (30) must be divisible"),
            std::string::npos);
  EXPECT_NE(error_of("[data]\ncutoff_day = 400\n")
                .find("data.cutoff_day (400) must be before data.days (365)"),
            std::string::npos);
  EXPECT_NE(error_of("[data]\nmax_len = 8\nmax_candidates = 8\n")
                .find("data.max_candidates must be smaller"),
            std::string::npos);
}

TEST(CtsmConfig, Overrides) {
  const LoadedConfig l =
      parse_config("[data]\nitems = 50\n", "c.toml", registry(),
                   {"data.items=500", "model.dropout=0.1", "eval.k=7", "data.dir=/tmp/d"});
  EXPECT_EQ(ctsm_of(l).data.items, 500);
  EXPECT_EQ(ctsm_of(l).model.dropout, 0.1);
  EXPECT_EQ(ctsm_of(l).eval.k, 7);
  EXPECT_EQ(ctsm_of(l).data.dir, "/tmp/d");
  const std::string m = error_of("", {"data.clients=lots"});
  EXPECT_NE(m.find("--set data.clients=lots"), std::string::npos) << m;
  EXPECT_NE(m.find("'data.clients' must be an integer, got a string"), std::string::npos) << m;
}

}  // namespace
