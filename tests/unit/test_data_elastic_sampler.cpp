// ElasticSampler: committed steps cover each epoch exactly once whatever the replica
// counts, a step's batches are disjoint, a discarded step's samples are dealt again, the
// order depends only on (seed, epoch), state()/set_state() resume identically, and bad
// arguments throw naming the value.
#include <lockstep/data/distributed_sampler.h>
#include <lockstep/data/elastic_sampler.h>
#include <lockstep/error.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

using lockstep::data::ElasticSampler;
using lockstep::data::ElasticSamplerOptions;

namespace {

using Batches = std::vector<std::vector<int64_t>>;

// Every replica's batch of the step being made.
Batches step_batches(const ElasticSampler& s, int replicas) {
  Batches out;
  for (int r = 0; r < replicas; ++r) out.push_back(s.batch(r, replicas));
  return out;
}

// Positions [from, to) of the epoch's order: what a batch must be, in closed form.
std::vector<int64_t> slice(const ElasticSampler& s, int64_t from, int64_t to) {
  return std::vector<int64_t>(s.order().begin() + from, s.order().begin() + to);
}

std::vector<size_t> sizes(const Batches& b) {
  std::vector<size_t> out;
  for (const auto& x : b) out.push_back(x.size());
  return out;
}

// Makes and commits one step; adds its samples to `seen` and checks that the replicas'
// batches are disjoint.
void commit_step(ElasticSampler& s, int replicas, std::map<int64_t, int>& seen) {
  std::set<int64_t> in_step;
  for (const auto& b : step_batches(s, replicas))
    for (int64_t i : b) {
      EXPECT_TRUE(in_step.insert(i).second) << "index " << i << " in two batches of one step";
      ++seen[i];
    }
  s.commit(replicas);
}

void expect_each_once(const std::map<int64_t, int>& seen, int64_t n) {
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
  for (const auto& [i, c] : seen) {
    EXPECT_GE(i, 0);
    EXPECT_LT(i, n);
    EXPECT_EQ(c, 1) << "index " << i;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lockstep::InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InvalidArgument thrown";
  return "";
}

}  // namespace

TEST(ElasticSampler, ReplicaCountChangesStillCoverTheEpochOnce) {
  // N = 103, b = 4: 3 steps of 3 replicas (36 samples), 5 of 2 (40, cursor 76), then 4
  // replicas: one full step (cursor 92) and a last one with 11 left: 4, 4, 3, 0.
  ElasticSampler s(103, 4, {.seed = 11});
  std::map<int64_t, int> seen;
  const std::vector<std::pair<int, int>> schedule = {{3, 3}, {5, 2}, {2, 4}};
  int64_t cursor = 0;
  for (const auto& [steps, replicas] : schedule) {
    for (int k = 0; k < steps; ++k) {
      ASSERT_EQ(s.epoch(), 0);
      ASSERT_EQ(s.cursor(), cursor);
      EXPECT_FALSE(s.epoch_done());
      const Batches b = step_batches(s, replicas);
      for (int r = 0; r < replicas; ++r) {
        const int64_t from = std::min<int64_t>(103, cursor + int64_t{4} * r);
        EXPECT_EQ(b[r], slice(s, from, std::min<int64_t>(103, from + 4))) << "rank " << r;
      }
      if (cursor == 92) {
        EXPECT_EQ(sizes(b), (std::vector<size_t>{4, 4, 3, 0}));
      }
      commit_step(s, replicas, seen);
      cursor = std::min<int64_t>(103, cursor + int64_t{4} * replicas);
    }
  }
  expect_each_once(seen, 103);
  // The last commit exhausted epoch 0: epoch 1 begins at once.
  EXPECT_EQ(s.epoch(), 1);
  EXPECT_EQ(s.cursor(), 0);
  EXPECT_TRUE(s.epoch_done());
  // The next commit moves into epoch 1, and epoch_done() clears.
  s.commit(2);
  EXPECT_EQ(s.state(), (std::pair<int64_t, int64_t>{1, 8}));
  EXPECT_FALSE(s.epoch_done());
}

TEST(ElasticSampler, DiscardedStepIsRetriedWithFewerReplicas) {
  ElasticSampler s(103, 4, {.seed = 3});
  std::map<int64_t, int> seen;
  commit_step(s, 3, seen);
  commit_step(s, 3, seen);
  ASSERT_EQ(s.cursor(), 24);
  // The third step fails (a replica is lost): batches were dealt, nothing committed.
  const Batches discarded = step_batches(s, 3);
  EXPECT_EQ(s.cursor(), 24);
  // The retry with the 2 survivors deals the same positions from the start: ranks 0 and
  // 1 get what they had; rank 2's samples (positions 32..35) come in the next step.
  const Batches retry = step_batches(s, 2);
  EXPECT_EQ(retry[0], discarded[0]);
  EXPECT_EQ(retry[1], discarded[1]);
  commit_step(s, 2, seen);
  EXPECT_EQ(s.cursor(), 32);
  EXPECT_EQ(s.batch(0, 2), discarded[2]);
  while (s.epoch() == 0) commit_step(s, 2, seen);
  // 24 + 8k reaches 103 after 10 more steps of 2 (the last one: 4 + 3 samples).
  expect_each_once(seen, 103);
  for (const auto& b : discarded)
    for (int64_t i : b) EXPECT_EQ(seen[i], 1) << "discarded sample " << i << " was lost";
}

TEST(ElasticSampler, OrderDependsOnlyOnSeedAndEpoch) {
  const int64_t n = 103;
  ElasticSampler a(n, 4, {.seed = 42});
  ElasticSampler b(n, 4, {.seed = 42});
  EXPECT_EQ(a.order(), b.order());
  EXPECT_EQ(a.batch(1, 3), b.batch(1, 3));
  // It is DistributedSampler's permutation of (seed, epoch): a real one, not the identity.
  const auto perm = lockstep::data::epoch_permutation(n, 42, 0);
  EXPECT_EQ(a.order(), std::vector<int64_t>(perm.begin(), perm.end()));
  std::vector<int64_t> sorted = a.order();
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(n);
  std::iota(iota.begin(), iota.end(), int64_t{0});
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(a.order(), iota);
  // A new epoch, a new order; the same epoch reached by commits or by set_state agrees.
  const auto epoch0 = a.order();
  while (a.epoch() == 0) a.commit(3);
  EXPECT_NE(a.order(), epoch0);
  b.set_state(1, 0);
  EXPECT_EQ(b.order(), a.order());
  b.set_state(0, 0);
  EXPECT_EQ(b.order(), epoch0);
  // Another seed, another order; no shuffle, 0..n-1 every epoch.
  EXPECT_NE(ElasticSampler(n, 4, {.seed = 43}).order(), epoch0);
  ElasticSampler plain(n, 4, {.shuffle = false});
  EXPECT_EQ(plain.order(), iota);
  EXPECT_EQ(plain.batch(2, 3), (std::vector<int64_t>{8, 9, 10, 11}));
  plain.set_state(5, 0);
  EXPECT_EQ(plain.order(), iota);
}

TEST(ElasticSampler, StateRoundTripContinuesIdentically) {
  ElasticSampler a(103, 4, {.seed = 7});
  for (int replicas : {3, 2, 4, 1, 3}) a.commit(replicas);
  const auto [epoch, cursor] = a.state();
  EXPECT_EQ(epoch, 0);
  EXPECT_EQ(cursor, 4 * (3 + 2 + 4 + 1 + 3));
  // A healed replica: fresh, then the healthy one's two integers.
  ElasticSampler b(103, 4, {.seed = 7});
  b.set_state(epoch, cursor);
  // Both go on through the epoch boundary and into the next epoch in lockstep.
  const int counts[] = {2, 3, 4};
  for (int k = 0; k < 40; ++k) {
    const int replicas = counts[k % 3];
    ASSERT_EQ(step_batches(a, replicas), step_batches(b, replicas)) << "step " << k;
    a.commit(replicas);
    b.commit(replicas);
    ASSERT_EQ(a.state(), b.state());
    ASSERT_EQ(a.epoch_done(), b.epoch_done());
  }
  EXPECT_GE(a.epoch(), 2);
  // A state restored at the start of a later epoch reads as "an epoch just finished".
  ElasticSampler c(103, 4);
  c.set_state(3, 0);
  EXPECT_TRUE(c.epoch_done());
}

TEST(ElasticSampler, EmptyDataset) {
  ElasticSampler s(0, 4);
  EXPECT_TRUE(s.order().empty());
  for (const auto& b : step_batches(s, 3)) EXPECT_TRUE(b.empty());
  // Every commit ends an empty epoch.
  s.commit(3);
  EXPECT_EQ(s.state(), (std::pair<int64_t, int64_t>{1, 0}));
  EXPECT_TRUE(s.epoch_done());
  s.commit(1);
  EXPECT_EQ(s.epoch(), 2);
  s.set_state(5, 0);
  EXPECT_EQ(s.epoch(), 5);
  EXPECT_THROW(s.set_state(0, 1), lockstep::InvalidArgument);
  ElasticSampler d(0, 4, {.drop_last = true});
  EXPECT_TRUE(d.batch(0, 1).empty());
  d.commit(1);
  EXPECT_EQ(d.epoch(), 1);
}

TEST(ElasticSampler, DatasetSmallerThanOneStep) {
  // N = 5, b = 4: 3 replicas get 4, 1, 0; one commit ends the epoch.
  ElasticSampler s(5, 4, {.seed = 1});
  const Batches b = step_batches(s, 3);
  EXPECT_EQ(sizes(b), (std::vector<size_t>{4, 1, 0}));
  std::map<int64_t, int> seen;
  commit_step(s, 3, seen);
  expect_each_once(seen, 5);
  EXPECT_EQ(s.state(), (std::pair<int64_t, int64_t>{1, 0}));
  // drop_last: no full step fits 2 replicas, so every batch is empty and the commit skips
  // the epoch; one replica gets a full batch, then the 1 left is skipped.
  ElasticSampler d(5, 4, {.seed = 1, .drop_last = true});
  for (const auto& x : step_batches(d, 2)) EXPECT_TRUE(x.empty());
  d.commit(2);
  EXPECT_EQ(d.state(), (std::pair<int64_t, int64_t>{1, 0}));
  EXPECT_EQ(d.batch(0, 1), slice(d, 0, 4));
  d.commit(1);
  EXPECT_EQ(d.cursor(), 4);
  EXPECT_TRUE(d.batch(0, 1).empty());
  d.commit(1);
  EXPECT_EQ(d.state(), (std::pair<int64_t, int64_t>{2, 0}));
}

TEST(ElasticSampler, DropLastNeverGivesAShortBatch) {
  // N = 103, b = 4, 3 replicas: 8 full steps (96), then 7 left < 12: all empty, and the
  // commit skips those 7.
  ElasticSampler s(103, 4, {.seed = 5, .drop_last = true});
  std::map<int64_t, int> seen;
  for (int k = 0; k < 8; ++k) {
    for (const auto& b : step_batches(s, 3)) EXPECT_EQ(b.size(), 4u);
    commit_step(s, 3, seen);
  }
  EXPECT_EQ(s.cursor(), 96);
  // With 1 replica, 7 left still fit one full batch; with 3 they do not.
  EXPECT_EQ(s.batch(0, 1), slice(s, 96, 100));
  for (const auto& b : step_batches(s, 3)) EXPECT_TRUE(b.empty());
  commit_step(s, 3, seen);
  EXPECT_EQ(s.state(), (std::pair<int64_t, int64_t>{1, 0}));
  EXPECT_EQ(seen.size(), 96u);
  for (const auto& [i, c] : seen) EXPECT_EQ(c, 1) << "index " << i;
}

TEST(ElasticSampler, HugeBatchSizeClipsInsteadOfOverflowing) {
  const int64_t b = std::numeric_limits<int64_t>::max() / 2;
  ElasticSampler s(10, b, {.shuffle = false});
  const Batches got = step_batches(s, 3);
  EXPECT_EQ(sizes(got), (std::vector<size_t>{10, 0, 0}));
  s.commit(3);
  EXPECT_EQ(s.state(), (std::pair<int64_t, int64_t>{1, 0}));
}

TEST(ElasticSampler, BadArgumentsNameTheValue) {
  auto has = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };
  EXPECT_TRUE(has(error_of([] { ElasticSampler(10, 0); }), "batch_size = 0"));
  EXPECT_TRUE(has(error_of([] { ElasticSampler(10, -3); }), "batch_size = -3"));
  EXPECT_TRUE(has(error_of([] { ElasticSampler(-1, 4); }), "dataset_size = -1"));
  ElasticSampler s(103, 4);
  const std::string rank = error_of([&] { s.batch(3, 3); });
  EXPECT_TRUE(has(rank, "rank 3 out of range [0, replicas = 3)")) << rank;
  EXPECT_TRUE(has(rank, "replica_rank()")) << rank;
  EXPECT_TRUE(has(error_of([&] { s.batch(-1, 2); }), "rank -1"));
  EXPECT_TRUE(has(error_of([&] { s.batch(0, 0); }), "replicas = 0"));
  EXPECT_TRUE(has(error_of([&] { s.commit(-2); }), "replicas = -2"));
  EXPECT_TRUE(has(error_of([&] { s.set_state(-1, 0); }), "epoch = -1"));
  const std::string end = error_of([&] { s.set_state(0, 103); });
  EXPECT_TRUE(has(end, "cursor = 103 out of range [0, 103)")) << end;
  EXPECT_TRUE(has(end, "(epoch + 1, 0)")) << end;
  EXPECT_TRUE(has(error_of([&] { s.set_state(0, -1); }), "cursor = -1"));
  // A failed call leaves the state alone.
  EXPECT_EQ(s.state(), (std::pair<int64_t, int64_t>{0, 0}));
}
