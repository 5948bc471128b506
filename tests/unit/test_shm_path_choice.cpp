// PathChooser: rank 0's choice between the shm allreduce's cached and streaming paths,
// fed with made-up timings.
#include "comm/backends/shm/path_choice.h"

#include <lockstep/error.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace lockstep::comm::shm {
namespace {

constexpr uint64_t kBig = uint64_t{64} << 20;

// Runs `ops` ops of `bytes` where cached takes `cached_s` and streaming `streaming_s`;
// returns how many took the streaming path.
int run(PathChooser& c, int ops, uint64_t bytes, double cached_s, double streaming_s) {
  int streaming = 0;
  for (int i = 0; i < ops; ++i) {
    const ShmPath p = c.choose(bytes);
    streaming += p == ShmPath::Streaming;
    c.record(p, bytes, p == ShmPath::Streaming ? streaming_s : cached_s);
  }
  return streaming;
}

TEST(ShmPathChoice, SmallOpsStayCachedAndUntimed) {
  PathChooser c;
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(c.choose(PathChooser::kMinBytes - 1), ShmPath::Cached);
    c.record(ShmPath::Cached, PathChooser::kMinBytes - 1, 1.0);
  }
  EXPECT_EQ(c.cost(ShmPath::Cached, PathChooser::kMinBytes - 1), 0.0);
}

TEST(ShmPathChoice, TriesBothThenKeepsTheFasterAndProbesTheOther) {
  PathChooser c;
  EXPECT_EQ(c.choose(kBig), ShmPath::Cached);  // first try: cached
  c.record(ShmPath::Cached, kBig, 0.010);
  EXPECT_EQ(c.choose(kBig), ShmPath::Streaming);  // then streaming once
  c.record(ShmPath::Streaming, kBig, 0.020);
  // From here cached wins; streaming only on every kProbeEvery-th op.
  const int n = 10 * PathChooser::kProbeEvery;
  const int streaming = run(c, n, kBig, 0.010, 0.020);
  EXPECT_EQ(streaming, n / PathChooser::kProbeEvery);
  EXPECT_DOUBLE_EQ(c.cost(ShmPath::Cached, kBig), 0.010 / kBig);
  EXPECT_DOUBLE_EQ(c.cost(ShmPath::Streaming, kBig), 0.020 / kBig);
}

TEST(ShmPathChoice, FollowsTheMachineWhenItChanges) {
  PathChooser c;
  run(c, 50, kBig, 0.010, 0.020);  // cores share a cache: cached wins
  // The cores stop sharing a cache: cached becomes 4x slower. Two slow samples outvote
  // the last fast one, and from then on streaming is the rule.
  run(c, 2, kBig, 0.040, 0.020);
  const int n = 4 * PathChooser::kProbeEvery;
  EXPECT_EQ(run(c, n, kBig, 0.040, 0.020), n - n / PathChooser::kProbeEvery);
  // And back: cached wins again after its probes show it fast.
  run(c, 2 * PathChooser::kProbeEvery + 1, kBig, 0.010, 0.020);
  EXPECT_EQ(run(c, n, kBig, 0.010, 0.020), n / PathChooser::kProbeEvery);
}

TEST(ShmPathChoice, OneOutlierDoesNotSwitch) {
  PathChooser c;
  run(c, 50, kBig, 0.010, 0.020);
  c.record(ShmPath::Cached, kBig, 0.100);  // one op disturbed by something else
  EXPECT_EQ(c.choose(kBig + 1), ShmPath::Cached);
}

TEST(ShmPathChoice, SizeClassesAreSeparate) {
  // Two sizes as in DDP (a bucket launched during backward, one after): each keeps
  // its own costs, so one size's conditions do not decide for the other.
  PathChooser c;
  const uint64_t small = uint64_t{16} << 20;
  run(c, 40, kBig, 0.010, 0.020);
  run(c, 40, small, 0.008, 0.002);
  EXPECT_EQ(c.choose(kBig + 5), ShmPath::Cached);
  EXPECT_EQ(c.choose(small + 5), ShmPath::Streaming);
}

TEST(ShmPathChoice, ForcedModesNeverProbe) {
  PathChooser cached(PathMode::Cached), streaming(PathMode::Streaming);
  EXPECT_EQ(run(cached, 100, kBig, 1.0, 0.001), 0);
  EXPECT_EQ(run(streaming, 100, kBig, 0.001, 1.0), 100);
  EXPECT_EQ(streaming.choose(16), ShmPath::Streaming);  // small ops too
}

TEST(ShmPathChoice, EnvironmentParsing) {
  ::unsetenv("LOCKSTEP_SHM_PATH");
  EXPECT_EQ(path_mode_from_environment(), PathMode::Auto);
  ::setenv("LOCKSTEP_SHM_PATH", "auto", 1);
  EXPECT_EQ(path_mode_from_environment(), PathMode::Auto);
  ::setenv("LOCKSTEP_SHM_PATH", "cached", 1);
  EXPECT_EQ(path_mode_from_environment(), PathMode::Cached);
  ::setenv("LOCKSTEP_SHM_PATH", "streaming", 1);
  EXPECT_EQ(path_mode_from_environment(), PathMode::Streaming);
  ::setenv("LOCKSTEP_SHM_PATH", "fast", 1);
  try {
    path_mode_from_environment();
    ADD_FAILURE() << "LOCKSTEP_SHM_PATH=fast was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("LOCKSTEP_SHM_PATH=fast: expected auto, cached or streaming"),
        std::string::npos)
        << e.what();
  }
  ::unsetenv("LOCKSTEP_SHM_PATH");
}

}  // namespace
}  // namespace lockstep::comm::shm
