// Bucket assignment: sizes, smaller first bucket, reverse order, dtype separation.
#include <lockstep/error.h>
#include <lockstep/parallel/ddp/bucket_assignment.h>

#include <gtest/gtest.h>

#include <numeric>

using lockstep::ddp::compute_bucket_assignment;

namespace {
std::vector<int64_t> reversed(size_t n) {
  std::vector<int64_t> o(n);
  std::iota(o.rbegin(), o.rend(), 0);
  return o;
}

TEST(DdpBuckets, FirstBucketSmallerThenCap) {
  // 10 float params of 100 elements = 400 bytes each.
  std::vector<int64_t> numels(10, 100);
  std::vector<at::ScalarType> dtypes(10, at::kFloat);
  auto b = compute_bucket_assignment(numels, dtypes, reversed(10),
                                     /*first_bucket_bytes=*/400, /*bucket_cap_bytes=*/1200);
  ASSERT_EQ(b.size(), 4u);  // 1 + 3 + 3 + 3
  EXPECT_EQ(b[0].params, (std::vector<int64_t>{9}));
  EXPECT_EQ(b[1].params, (std::vector<int64_t>{8, 7, 6}));
  EXPECT_EQ(b[2].params, (std::vector<int64_t>{5, 4, 3}));
  EXPECT_EQ(b[3].params, (std::vector<int64_t>{2, 1, 0}));
  EXPECT_EQ(b[0].bytes, 400);
  EXPECT_EQ(b[1].bytes, 1200);
}

TEST(DdpBuckets, OversizedParamGetsOwnBucket) {
  std::vector<int64_t> numels{10, 1000000, 10};
  std::vector<at::ScalarType> dtypes(3, at::kFloat);
  auto b = compute_bucket_assignment(numels, dtypes, reversed(3), 100, 1000);
  // The small param 2 (40 B) opens the first bucket; the big one joins and closes it.
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].params, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(b[1].params, (std::vector<int64_t>{0}));
}

TEST(DdpBuckets, DtypeSeparation) {
  std::vector<int64_t> numels{4, 4, 4, 4};
  std::vector<at::ScalarType> dtypes{at::kFloat, at::kDouble, at::kFloat, at::kDouble};
  auto b = compute_bucket_assignment(numels, dtypes, reversed(4), 1 << 20, 1 << 20);
  ASSERT_EQ(b.size(), 2u);
  // Sorted by first position in the order: param 3 (double) comes first.
  EXPECT_EQ(b[0].dtype, at::kDouble);
  EXPECT_EQ(b[0].params, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(b[1].dtype, at::kFloat);
  EXPECT_EQ(b[1].params, (std::vector<int64_t>{2, 0}));
  for (auto& bucket : b)
    for (auto p : bucket.params) EXPECT_EQ(dtypes[p], bucket.dtype);
}

TEST(DdpBuckets, FollowsGivenOrderAndIsDeterministic) {
  std::vector<int64_t> numels{100, 100, 100, 100};
  std::vector<at::ScalarType> dtypes(4, at::kFloat);
  std::vector<int64_t> order{1, 3, 0, 2};
  auto a = compute_bucket_assignment(numels, dtypes, order, 400, 800);
  auto b = compute_bucket_assignment(numels, dtypes, order, 400, 800);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].params, (std::vector<int64_t>{1}));
  EXPECT_EQ(a[1].params, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(a[2].params, (std::vector<int64_t>{2}));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].params, b[i].params);
}

TEST(DdpBuckets, EveryParamExactlyOnce) {
  std::vector<int64_t> numels{3, 0, 70000, 5, 1, 262144, 9};
  std::vector<at::ScalarType> dtypes{at::kFloat, at::kFloat, at::kFloat, at::kHalf,
                                     at::kFloat, at::kFloat, at::kHalf};
  auto b = compute_bucket_assignment(numels, dtypes, reversed(7), 1 << 20, 25 << 20);
  std::vector<int> count(7, 0);
  for (auto& bucket : b)
    for (auto p : bucket.params) ++count[p];
  for (int c : count) EXPECT_EQ(c, 1);
}

TEST(DdpBuckets, RejectsBadOrder) {
  std::vector<int64_t> numels{1, 1};
  std::vector<at::ScalarType> dtypes(2, at::kFloat);
  EXPECT_THROW(compute_bucket_assignment(numels, dtypes, {0, 0}, 1, 1), lockstep::InvalidArgument);
  EXPECT_THROW(compute_bucket_assignment(numels, dtypes, {0}, 1, 1), lockstep::InvalidArgument);
}

}  // namespace
