// DistributedSampler: shares are disjoint and cover the dataset, padding/drop_last
// counts match PyTorch's, the permutation is the same on every rank and changes with
// the epoch, and it drives libtorch's make_data_loader.
#include <lockstep/data/distributed_sampler.h>
#include <lockstep/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>

using lockstep::data::DistributedSampler;
using lockstep::data::DistributedSamplerOptions;

namespace {

std::vector<std::vector<size_t>> shares(size_t n, int world, DistributedSamplerOptions o,
                                        uint64_t epoch = 0) {
  std::vector<std::vector<size_t>> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, world, r, o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

// Drains a sampler through next() the way a loader does.
std::vector<size_t> drain(DistributedSampler& s, size_t batch) {
  std::vector<size_t> all;
  while (auto b = s.next(batch)) {
    EXPECT_LE(b->size(), batch);
    all.insert(all.end(), b->begin(), b->end());
  }
  return all;
}

}  // namespace

class SamplerSizes : public ::testing::TestWithParam<std::tuple<size_t, int, bool>> {};

TEST_P(SamplerSizes, DisjointAndCovering) {
  const auto [n, world, shuffle] = GetParam();
  for (bool drop_last : {false, true}) {
    SCOPED_TRACE(testing::Message() << "n=" << n << " world=" << world << " shuffle=" << shuffle
                                    << " drop_last=" << drop_last);
    auto sh = shares(n, world, {.shuffle = shuffle, .seed = 7, .drop_last = drop_last});
    const size_t expect = drop_last ? n / world : (n + world - 1) / world;
    std::map<size_t, int> seen;
    for (const auto& s : sh) {
      EXPECT_EQ(s.size(), expect);  // every rank the same count
      for (size_t i : s) {
        EXPECT_LT(i, n);
        ++seen[i];
      }
    }
    if (drop_last) {
      // Each index at most once; exactly n - n % world distinct ones.
      for (auto& [i, c] : seen) EXPECT_EQ(c, 1) << "index " << i;
      EXPECT_EQ(seen.size(), n - n % world);
    } else if (n > 0) {
      // Every index at least once; the padding repeats only world*expect - n of them.
      EXPECT_EQ(seen.size(), n);
      size_t extra = 0;
      for (auto& [i, c] : seen) extra += c - 1;
      EXPECT_EQ(extra, expect * world - n);
      if (n % world == 0) {
        for (auto& [i, c] : seen) EXPECT_EQ(c, 1);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, SamplerSizes,
                         ::testing::Combine(::testing::Values<size_t>(0, 1, 2, 3, 10, 11, 100,
                                                                      1001),
                                            ::testing::Values(1, 2, 3, 4), ::testing::Bool()));

TEST(DistributedSampler, PaddingWrapsAroundLikePyTorch) {
  // n=10, world=4, no shuffle: padded list 0..9,0,1; rank r takes r, r+4, r+8.
  auto sh = shares(10, 4, {.shuffle = false});
  EXPECT_EQ(sh[0], (std::vector<size_t>{0, 4, 8}));
  EXPECT_EQ(sh[1], (std::vector<size_t>{1, 5, 9}));
  EXPECT_EQ(sh[2], (std::vector<size_t>{2, 6, 0}));
  EXPECT_EQ(sh[3], (std::vector<size_t>{3, 7, 1}));
  // drop_last: the list is cut to 8.
  auto dl = shares(10, 4, {.shuffle = false, .seed = 0, .drop_last = true});
  EXPECT_EQ(dl[2], (std::vector<size_t>{2, 6}));
  // World larger than the dataset: wraps repeatedly.
  auto big = shares(2, 5, {.shuffle = false});
  for (int r = 0; r < 5; ++r) EXPECT_EQ(big[r], (std::vector<size_t>{size_t(r % 2)}));
}

TEST(DistributedSampler, SamePermutationOnEveryRank) {
  // Ranks never talk: they must derive the same permutation independently, which is
  // what makes the strided shares disjoint. Rebuild it from the shares and compare.
  const size_t n = 1000;
  const int world = 4;
  auto sh = shares(n, world, {.seed = 42}, 3);
  auto perm = lockstep::data::epoch_permutation(n, 42, 3);
  for (int r = 0; r < world; ++r)
    for (size_t k = 0; k < sh[r].size(); ++k) EXPECT_EQ(sh[r][k], perm[r + k * world]);
  // And independently of construction order / other samplers' use of any RNG.
  torch::manual_seed(123);
  (void)torch::rand({10});
  DistributedSampler again(n, world, 2, {.seed = 42});
  again.set_epoch(3);
  EXPECT_EQ(again.indices(), sh[2]);
}

TEST(DistributedSampler, PermutationChangesWithEpochAndSeed) {
  const size_t n = 500;
  DistributedSampler s(n, 2, 0, {.seed = 1});
  s.set_epoch(0);
  auto e0 = s.indices();
  s.set_epoch(1);
  auto e1 = s.indices();
  EXPECT_NE(e0, e1);
  s.set_epoch(0);
  EXPECT_EQ(s.indices(), e0);  // deterministic
  DistributedSampler other(n, 2, 0, {.seed = 2});
  EXPECT_NE(other.indices(), e0);
  // Actually shuffled, and a real permutation.
  auto p = lockstep::data::epoch_permutation(n, 1, 0);
  std::vector<size_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
  size_t fixed = 0;
  for (size_t i = 0; i < n; ++i) fixed += p[i] == i;
  EXPECT_LT(fixed, 10u);
  // Epoch 1 of seed 0 is not epoch 0 of seed 1.
  EXPECT_NE(lockstep::data::epoch_permutation(n, 0, 1), lockstep::data::epoch_permutation(n, 1, 0));
}

TEST(DistributedSampler, NextYieldsIndicesInBatches) {
  DistributedSampler s(103, 2, 1, {.seed = 5});
  auto all = drain(s, 10);
  EXPECT_EQ(all, s.indices());
  EXPECT_EQ(all.size(), 52u);
  EXPECT_FALSE(s.next(10).has_value());
  s.reset();
  EXPECT_EQ(drain(s, 64), all);
  s.reset(11);  // a new dataset size
  EXPECT_EQ(s.num_samples(), 6u);
  EXPECT_EQ(drain(s, 4).size(), 6u);
}

TEST(DistributedSampler, SaveAndLoadResumeMidEpoch) {
  DistributedSampler s(100, 2, 0, {.seed = 9});
  s.set_epoch(4);
  s.reset();
  auto first = s.next(20).value();
  torch::serialize::OutputArchive out;
  s.save(out);
  std::stringstream buf;
  out.save_to(buf);
  auto rest = drain(s, 7);

  DistributedSampler t(100, 2, 0, {.seed = 9});
  torch::serialize::InputArchive in;
  in.load_from(buf);
  t.load(in);
  EXPECT_EQ(t.epoch(), 4u);
  EXPECT_EQ(drain(t, 7), rest);

  // A sampler of another world size refuses the archive.
  DistributedSampler u(100, 4, 0, {.seed = 9});
  buf.clear();
  buf.seekg(0);
  torch::serialize::InputArchive in2;
  in2.load_from(buf);
  EXPECT_THROW(u.load(in2), lockstep::InvalidArgument);
}

TEST(DistributedSampler, RejectsBadRank) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), lockstep::InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 2, -1), lockstep::InvalidArgument);
  EXPECT_THROW(DistributedSampler(10, 0, 0), lockstep::InvalidArgument);
}

TEST(DistributedSampler, ArgumentsInPyTorchsOrder) {
  // (dataset size, num_replicas, rank), as torch.utils.data.DistributedSampler.
  DistributedSampler s(10, 4, 1, {.shuffle = false});
  EXPECT_EQ(s.world_size(), 4);
  EXPECT_EQ(s.rank(), 1);
  EXPECT_EQ(s.indices(), (std::vector<size_t>{1, 5, 9}));
  // A valid pair written the other way round (rank 1 of 3) is never valid in this order.
  EXPECT_THROW(DistributedSampler(10, 1, 3), lockstep::InvalidArgument);
}

namespace {
// Example i = {tensor(i), tensor(i)}: the loader's batches show which indices it drew.
struct Iota : torch::data::datasets::Dataset<Iota> {
  explicit Iota(size_t n) : n(n) {}
  torch::data::Example<> get(size_t i) override {
    return {torch::tensor(static_cast<int64_t>(i)), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return n; }
  size_t n;
};
}  // namespace

TEST(DistributedSampler, DrivesMakeDataLoaderAndFollowsSetEpoch) {
  const size_t n = 203;
  const int world = 3;
  std::multiset<int64_t> seen;
  std::vector<std::vector<int64_t>> epoch0(world), epoch1(world);
  for (int r = 0; r < world; ++r) {
    DistributedSampler sampler(n, world, r, {.seed = 3});
    auto loader =
        torch::data::make_data_loader(Iota(n).map(torch::data::transforms::Stack<>()), sampler,
                                      torch::data::DataLoaderOptions().batch_size(16));
    for (int e = 0; e < 2; ++e) {
      sampler.set_epoch(e);  // reaches the loader's copy
      std::vector<int64_t> got;
      for (auto& batch : *loader) {
        EXPECT_LE(batch.data.size(0), 16);
        EXPECT_TRUE(torch::equal(batch.data, batch.target));
        for (int64_t k = 0; k < batch.data.size(0); ++k)
          got.push_back(batch.data[k].item<int64_t>());
      }
      const auto idx = sampler.indices();
      std::vector<int64_t> want(idx.begin(), idx.end());
      EXPECT_EQ(got, want) << "rank " << r << " epoch " << e;
      (e == 0 ? epoch0 : epoch1)[r] = got;
      if (e == 0) seen.insert(got.begin(), got.end());
    }
    EXPECT_NE(epoch0[r], epoch1[r]);
  }
  // 203 over 3 ranks: 68 each, 1 index padded twice; all 203 seen.
  EXPECT_EQ(seen.size(), 204u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), n);
}
