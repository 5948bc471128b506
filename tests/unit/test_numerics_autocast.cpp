#include <lockstep/error.h>
#include <lockstep/numerics/autocast.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace numerics = lockstep::numerics;

TEST(Autocast, MatmulRunsInBf16InsideAndFp32Outside) {
  auto a = torch::randn({8, 8});
  auto b = torch::randn({8, 8});
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
  {
    numerics::Autocast ac;
    EXPECT_TRUE(numerics::is_enabled());
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    // Ops outside the low-precision list keep their input dtype.
    EXPECT_EQ((a + b).scalar_type(), torch::kFloat);
  }
  EXPECT_FALSE(numerics::is_enabled());
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
}

TEST(Autocast, LinearModuleForwardAndBackward) {
  torch::nn::Linear lin(16, 4);
  auto x = torch::randn({3, 16});
  torch::Tensor y;
  {
    numerics::Autocast ac;
    y = lin->forward(x);
  }
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  y.sum().backward();
  // Gradients land on the fp32 parameters in fp32.
  ASSERT_TRUE(lin->weight.grad().defined());
  EXPECT_EQ(lin->weight.grad().scalar_type(), torch::kFloat);
}

TEST(Autocast, NestingRestoresTheOuterState) {
  auto a = torch::randn({4, 4});
  numerics::Autocast outer;
  {
    numerics::AutocastOptions off;
    off.enabled = false;
    numerics::Autocast inner(off);
    EXPECT_FALSE(numerics::is_enabled());
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
  }
  EXPECT_TRUE(numerics::is_enabled());
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
}

TEST(Autocast, CapturedStateReentersExactly) {
  numerics::AutocastState captured;
  {
    numerics::Autocast ac;
    captured = numerics::current_state();
  }
  EXPECT_FALSE(numerics::is_enabled());
  {
    numerics::Autocast again(captured);
    EXPECT_TRUE(numerics::is_enabled());
    EXPECT_EQ(numerics::current_state().cpu_dtype, torch::kBFloat16);
  }
  EXPECT_FALSE(numerics::is_enabled());
}

TEST(Autocast, StateIsThreadLocal) {
  numerics::Autocast ac;
  bool other_thread_enabled = true;
  std::thread t([&] { other_thread_enabled = numerics::is_enabled(); });
  t.join();
  EXPECT_FALSE(other_thread_enabled);
  EXPECT_TRUE(numerics::is_enabled());
}

TEST(Autocast, UnsupportedRequestsAreRejected) {
  numerics::AutocastOptions f64;
  f64.dtype = torch::kDouble;
  EXPECT_THROW(numerics::Autocast{f64}, lockstep::InvalidArgument);
  EXPECT_FALSE(numerics::is_enabled());  // a rejected guard changed nothing
  if (!torch::cuda::is_available()) {
    numerics::AutocastOptions cuda;
    cuda.device = torch::kCUDA;
    cuda.dtype = torch::kHalf;
    EXPECT_THROW(numerics::Autocast{cuda}, lockstep::InvalidArgument);
  }
}
