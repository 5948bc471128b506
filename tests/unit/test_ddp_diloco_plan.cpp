// DiLoCo's fragment plan (every parameter in exactly one fragment, in order, of about equal
// size, staggered over the round) and its option checks.
#include <lockstep/parallel/diloco/diloco.h>

#include <gtest/gtest.h>

#include <set>

using lockstep::diloco::DiLoCoOptions;
using lockstep::diloco::plan_fragments;

TEST(DiLoCoPlan, EveryParameterOnceInOrder) {
  const std::vector<int64_t> numels{100, 5, 300, 7, 7, 200, 1, 80};
  for (int64_t F = 1; F <= int64_t(numels.size()); ++F) {
    const auto frags = plan_fragments(numels, F, 12);
    ASSERT_EQ(int64_t(frags.size()), F);
    int64_t next = 0;
    std::set<int64_t> offsets;
    for (const auto& f : frags) {
      EXPECT_EQ(f.first, next) << "F = " << F;
      EXPECT_GE(f.count, 1);
      int64_t n = 0;
      for (int64_t i = f.first; i < f.first + f.count; ++i) n += numels[size_t(i)];
      EXPECT_EQ(f.numel, n);
      next = f.first + f.count;
      offsets.insert(f.offset);
      EXPECT_GE(f.offset, 0);
      EXPECT_LT(f.offset, 12);
    }
    EXPECT_EQ(next, int64_t(numels.size())) << "F = " << F;
    EXPECT_EQ(int64_t(offsets.size()), F) << "each fragment has its own step of the round";
  }
}

TEST(DiLoCoPlan, BalancedAndStaggered) {
  const std::vector<int64_t> numels(12, 10);
  const auto frags = plan_fragments(numels, 4, 8);
  for (const auto& f : frags) EXPECT_EQ(f.numel, 30);
  EXPECT_EQ(frags[0].offset, 2);
  EXPECT_EQ(frags[1].offset, 4);
  EXPECT_EQ(frags[2].offset, 6);
  EXPECT_EQ(frags[3].offset, 0);  // the last fragment closes the round, as DiLoCo's one
  EXPECT_EQ(plan_fragments(numels, 1, 8)[0].offset, 0);
}

TEST(DiLoCoPlan, TooManyFragments) {
  EXPECT_THROW(plan_fragments({4, 4}, 3, 10), lockstep::InvalidArgument);
}

TEST(DiLoCoOptions, Validation) {
  auto bad = [](auto edit) {
    DiLoCoOptions o;
    edit(o);
    EXPECT_THROW(validate(o), lockstep::InvalidArgument);
  };
  bad([](DiLoCoOptions& o) { o.inner_steps = 0; });
  bad([](DiLoCoOptions& o) { o.outer_lr = 0; });
  bad([](DiLoCoOptions& o) { o.outer_momentum = 1; });
  bad([](DiLoCoOptions& o) { o.outer_momentum = 0; });  // nesterov without momentum
  bad([](DiLoCoOptions& o) { o.fragments = 51; });
  bad([](DiLoCoOptions& o) { o.overlap_steps = 50; });
  bad([](DiLoCoOptions& o) { o.mixing = 1; });
  bad([](DiLoCoOptions& o) {
    o.compression = lockstep::diloco::OuterCompression::kQsgd;
    o.qsgd_bits = 9;
  });
  EXPECT_NO_THROW(validate(DiLoCoOptions{}));
  EXPECT_NO_THROW(validate(DiLoCoOptions::local_sgd(10)));
  try {
    DiLoCoOptions o;
    o.overlap_steps = 60;
    validate(o);
  } catch (const lockstep::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("overlap_steps = 60"), std::string::npos) << e.what();
  }
}
