// Unit tests of the per-layer policy, the environment overrides and the allreduce plan.
#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/compress/policy.h>

#include <gtest/gtest.h>

#include <cstdlib>

using namespace lockstep::compress;

namespace {
struct EnvGuard {
  std::vector<std::string> names;
  void set(const std::string& k, const std::string& v) {
    setenv(k.c_str(), v.c_str(), 1);
    names.push_back(k);
  }
  ~EnvGuard() {
    for (auto& k : names) unsetenv(k.c_str());
  }
};

TEST(CompressPolicy, SmallAndExcludedLayersStayPlain) {
  QsgdOptions o;
  EXPECT_TRUE(should_compress(o, "fc1.weight", 4096));
  EXPECT_FALSE(should_compress(o, "fc1.bias", 4096));
  EXPECT_FALSE(should_compress(o, "layer_norm.weight", 1 << 20));
  EXPECT_FALSE(should_compress(o, "fc2.weight", 1023));
  o.bits = 32;
  EXPECT_FALSE(should_compress(o, "fc1.weight", 4096));
}

TEST(CompressPolicy, EnvironmentOverrides) {
  EnvGuard g;
  g.set("LOCKSTEP_COMPRESSION_BITS", "2");
  g.set("LOCKSTEP_COMPRESSION_BUCKET_SIZE", "512");
  g.set("LOCKSTEP_COMPRESSION_MIN_LAYER", "10");
  g.set("LOCKSTEP_COMPRESSION_EXCLUDE", "emb,head");
  auto o = apply_env({});
  EXPECT_EQ(o.bits, 2);
  EXPECT_EQ(o.bucket_size, 512);
  EXPECT_EQ(o.min_layer, 10);
  EXPECT_EQ(o.exclude, (std::vector<std::string>{"emb", "head"}));
  EXPECT_TRUE(should_compress(o, "fc.bias", 100));
  EXPECT_TRUE(options_from_env().has_value());
}

TEST(CompressPolicy, BadEnvironmentNamesTheVariable) {
  for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"LOCKSTEP_COMPRESSION_BITS", "9"},
           {"LOCKSTEP_COMPRESSION_BITS", "four"},
           {"LOCKSTEP_COMPRESSION_BUCKET_SIZE", "0"},
           {"LOCKSTEP_COMPRESSION_MIN_LAYER", "-1"},
           {"LOCKSTEP_COMPRESSION_ERROR_FEEDBACK", "yes"}}) {
    EnvGuard g;
    g.set(k, v);
    try {
      apply_env({});
      ADD_FAILURE() << k << "=" << v << " accepted";
    } catch (const lockstep::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(k), std::string::npos) << e.what();
    }
  }
}

TEST(CompressPlan, PartsSplitOnBucketBoundariesAndCoverEverything) {
  QsgdOptions o;
  o.bucket_size = 128;
  std::vector<LayerSpan> layers{{"a.weight", 0, 5000},
                                {"a.bias", 5000, 100},
                                {"b.weight", 5100, 3001},
                                {"c.weight", 8101, 999}};
  for (int P = 1; P <= 4; ++P) {
    CompressedAllreduce plan(o, layers, 9100, P);
    int64_t covered = 0;
    for (int r = 0; r < P; ++r)
      for (const auto& run : plan.part(r)) {
        const auto& l = run.offset < 5100 ? layers[0] : layers[2];
        EXPECT_EQ((run.offset - l.offset) % 128, 0) << "run must start on a bucket boundary";
        EXPECT_LE(run.offset + run.numel, l.offset + l.numel) << "run must stay in its layer";
        covered += run.numel;
      }
    EXPECT_EQ(covered, 5000 + 3001);  // bias and the 999-element layer stay plain
  }
}

}  // namespace
