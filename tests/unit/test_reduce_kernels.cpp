// copy_streaming: every alignment and length, nothing written outside the range.
// reduce_many / reduce_inplace against a libtorch reference: every dtype x op,
// k = 1..6 sources (fused 2/3/4-way kernels and the blocked fold), odd lengths,
// and dst aliasing srcs[0]. Results must match bit for bit: the reference folds
// in the same order and, for 16-bit floats, accumulates in float32 and rounds once.
#include "comm/reduce_kernels.h"

#include <lockstep/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

namespace lockstep::comm {
namespace {

struct Case {
  at::ScalarType dtype;
  ReduceOp op;
};

at::Tensor random_input(at::ScalarType t, int64_t n, int seed) {
  torch::manual_seed(seed);
  switch (t) {
    case at::kByte:
      return torch::randint(0, 256, {n}, torch::kLong).to(t);  // Sum wraps
    case at::kInt:
    case at::kLong:
      return torch::randint(-1000000, 1000000, {n}, torch::kLong).to(t);
    default:
      return (torch::randn({n}, torch::kDouble) * 100).to(t);
  }
}

at::Tensor reference(const std::vector<at::Tensor>& srcs, at::ScalarType t, ReduceOp op) {
  const bool half = t == at::kHalf || t == at::kBFloat16;
  at::Tensor acc = half ? srcs[0].to(at::kFloat) : srcs[0].clone();
  for (size_t j = 1; j < srcs.size(); ++j) {
    at::Tensor s = half ? srcs[j].to(at::kFloat) : srcs[j];
    if (op == ReduceOp::Sum)
      acc = acc + s;
    else if (op == ReduceOp::Max)
      acc = torch::maximum(acc, s);
    else
      acc = torch::minimum(acc, s);
  }
  return acc.to(t);
}

class ReduceKernels : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceKernels, MatchesTorch) {
  const auto [dtype, op] = GetParam();
  for (int k = 1; k <= 6; ++k) {
    for (int64_t n : {0, 1, 7, 1000, 4097, 20000}) {
      std::vector<at::Tensor> srcs;
      std::vector<const void*> ptrs;
      for (int j = 0; j < k; ++j) {
        srcs.push_back(random_input(dtype, n, 17 * k + j + static_cast<int>(n)));
        ptrs.push_back(srcs.back().data_ptr());
      }
      const at::Tensor want = reference(srcs, dtype, op);
      at::Tensor got = torch::full({n}, 3, srcs[0].options());
      reduce_many(got.data_ptr(), ptrs.data(), k, n, dtype, op);
      EXPECT_TRUE(torch::equal(got, want)) << "k=" << k << " n=" << n;

      // dst aliases srcs[0]
      at::Tensor inplace = srcs[0].clone();
      ptrs[0] = inplace.data_ptr();
      reduce_many(inplace.data_ptr(), ptrs.data(), k, n, dtype, op);
      EXPECT_TRUE(torch::equal(inplace, want)) << "alias k=" << k << " n=" << n;
    }
  }
}

TEST_P(ReduceKernels, Inplace) {
  const auto [dtype, op] = GetParam();
  for (int64_t n : {0, 1, 7, 1000, 4097}) {
    at::Tensor a = random_input(dtype, n, 1), b = random_input(dtype, n, 2);
    const at::Tensor want = reference({a, b}, dtype, op);
    reduce_inplace(a.data_ptr(), b.data_ptr(), n, dtype, op);
    EXPECT_TRUE(torch::equal(a, want)) << "n=" << n;
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (auto t : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong, at::kByte})
    for (auto op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) cases.push_back({t, op});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndOps, ReduceKernels, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(c10::toString(info.param.dtype)) + "_" +
                                  reduce_op_name(info.param.op);
                         });

TEST(ReduceKernelsNaN, MaxMinPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float a[2] = {nan, 1.0f}, b[2] = {2.0f, nan}, out[2];
  const void* srcs[2] = {a, b};
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
    reduce_many(out, srcs, 2, 2, at::kFloat, op);
    EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1])) << reduce_op_name(op);
  }
}

TEST(ReduceKernelsArgs, RejectsAvg) {
  float a = 1, b = 2;
  const void* srcs[2] = {&a, &b};
  EXPECT_THROW(reduce_many(&a, srcs, 2, 1, at::kFloat, ReduceOp::Avg), lockstep::Error);
}

TEST(CopyStreaming, EveryAlignmentAndLength) {
  // Misaligned heads, the 64-byte body and short tails: every byte lands, nothing past.
  std::vector<unsigned char> src(700), dst(720);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 37 + 11);
  for (int d_off : {0, 1, 7, 15, 16, 33}) {
    for (int s_off : {0, 3}) {
      for (int64_t n : {0, 1, 15, 16, 63, 64, 65, 129, 600}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        copy_streaming(dst.data() + d_off, src.data() + s_off, n);
        for (int i = 0; i < d_off; ++i) ASSERT_EQ(dst[i], 0xEE);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(dst[d_off + i], src[s_off + i])
              << "d_off " << d_off << " n " << n << " i " << i;
        ASSERT_EQ(dst[d_off + n], 0xEE) << "wrote past the end, n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace lockstep::comm
