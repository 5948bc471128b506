// The training windows: a pure function of (seed, epoch, rank, world) that deals each
// epoch's windows to the ranks without overlap, replays after a skip as a resumed run
// needs, and gives next-byte targets.
#include <lm/batch_stream.h>

#include <lockstep/error.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>

using lm::WindowStream;

namespace {

// Random letters: every window of 20 or more bytes occurs once (26^20 possibilities).
std::shared_ptr<const std::string> text_of(size_t n) {
  std::mt19937_64 rng(17);
  auto s = std::make_shared<std::string>(n, '\0');
  for (auto& c : *s) c = char('a' + rng() % 26);
  return s;
}

std::vector<int64_t> starts_of(const lm::LmBatch& b, const std::string& text) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < b.input.size(0); ++i) {
    std::string w;
    for (int64_t t = 0; t < b.input.size(1); ++t) w += char(b.input[i][t].item<int64_t>());
    out.push_back(int64_t(text.find(w)));  // the text's windows are unique at this length
  }
  return out;
}

}  // namespace

TEST(LmWindows, EpochDealsDisjointWindowsToTheRanks) {
  const int64_t size = 10007, T = 16;
  const int64_t n = WindowStream::windows_per_epoch(size, T);
  EXPECT_EQ(n, size / T - 1);
  for (int world : {1, 2, 3}) {
    std::set<int64_t> seen;
    int64_t total = 0, shift = -1;
    for (int r = 0; r < world; ++r) {
      const auto s = WindowStream::epoch_starts(size, T, 9, 4, r, world);
      EXPECT_EQ(int64_t(s.size()), WindowStream::windows_of_rank(size, T, r, world));
      total += int64_t(s.size());
      for (int64_t x : s) {
        EXPECT_TRUE(seen.insert(x).second) << "window " << x << " dealt twice";
        EXPECT_GE(x, 0);
        EXPECT_LE(x + T + 1, size) << "window past the end";
        if (shift < 0) shift = x % T;
        EXPECT_EQ(x % T, shift) << "one tiling per epoch";
      }
    }
    EXPECT_EQ(total, n) << "world " << world;
  }
}

TEST(LmWindows, OrderIsAPureFunctionOfSeedEpochRank) {
  const auto a = WindowStream::epoch_starts(5000, 32, 1, 0, 0, 2);
  EXPECT_EQ(a, WindowStream::epoch_starts(5000, 32, 1, 0, 0, 2));
  EXPECT_NE(a, WindowStream::epoch_starts(5000, 32, 1, 1, 0, 2));  // next epoch
  EXPECT_NE(a, WindowStream::epoch_starts(5000, 32, 2, 0, 0, 2));  // another seed
  EXPECT_NE(a, WindowStream::epoch_starts(5000, 32, 1, 0, 1, 2));  // the other rank
}

TEST(LmWindows, SkipReplaysTheRestOfTheEpoch) {
  auto text = text_of(4000);
  WindowStream full(text, 24, 1, 2, 3), resumed(text, 24, 1, 2, 3);
  full.begin_epoch(2, 0);
  full.next(7);  // what ran before the "checkpoint"
  resumed.begin_epoch(2, 7);
  for (int i = 0; i < 5; ++i) {
    const auto a = full.next(6), b = resumed.next(6);
    ASSERT_TRUE(torch::equal(a.input, b.input)) << "batch " << i;
    ASSERT_TRUE(torch::equal(a.target, b.target)) << "batch " << i;
  }
  // The stream's windows are the plan's, and the epoch ends where the plan does.
  WindowStream s(text, 24, 1, 2, 3);
  s.begin_epoch(2, 0);
  const auto plan = WindowStream::epoch_starts(4000, 24, 3, 2, 1, 2);
  const auto b = s.next(int64_t(plan.size()) + 10);
  EXPECT_EQ(b.input.size(0), int64_t(plan.size()));
  EXPECT_EQ(starts_of(b, *text), plan);
  EXPECT_EQ(s.next(4).input.size(0), 0);
}

TEST(LmWindows, TargetsAreTheNextBytes) {
  const std::string text = "0123456789abcdefghij";
  const auto b = lm::window_batch(text, {0, 5, 9}, 10);
  ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{3, 10}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t t = 0; t < 10; ++t) {
      const int64_t s = std::vector<int64_t>{0, 5, 9}[size_t(i)];
      EXPECT_EQ(b.input[i][t].item<int64_t>(), text[size_t(s + t)]);
      EXPECT_EQ(b.target[i][t].item<int64_t>(), text[size_t(s + t + 1)]);
    }
  EXPECT_THROW(lm::window_batch(text, {10}, 10), lockstep::InvalidArgument);  // needs 11 bytes
}

TEST(LmWindows, TooShortATextForTheRanksIsNamed) {
  EXPECT_THROW(WindowStream(text_of(40), 16, 0, 2, 1), lockstep::InvalidArgument);  // 1 window
  EXPECT_NO_THROW(WindowStream(text_of(48), 16, 1, 2, 1));                          // 2 windows
}
