#include <lockstep/error.h>
#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/numerics/non_finite.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <sstream>

namespace numerics = lockstep::numerics;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

torch::nn::Sequential small_net(torch::Dtype dtype) {
  torch::manual_seed(3);
  torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
  net->to(dtype);
  return net;
}

// Trains `steps` SGD steps on a fixed regression, with or without a scaler; returns the
// flattened parameters.
torch::Tensor train(torch::Dtype dtype, numerics::GradScaler* scaler, int steps) {
  auto net = small_net(dtype);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::manual_seed(7);
  auto x = torch::randn({32, 6}, dtype);
  auto y = torch::randn({32, 1}, dtype);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    auto loss = torch::mse_loss(net->forward(x), y);
    if (scaler != nullptr) {
      scaler->scale(loss).backward();
      scaler->step(opt);
      scaler->update();
    } else {
      loss.backward();
      opt.step();
    }
  }
  return torch::cat([&] {
    std::vector<torch::Tensor> v;
    for (auto& p : net->parameters()) v.push_back(p.detach().flatten());
    return v;
  }());
}

TEST(NonFinite, UnscaleDividesAndFindsInfAndNan) {
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kHalf}) {
    auto a = torch::full({100000}, 8.0, dtype);  // large enough to run in parallel chunks
    auto b = torch::full({7}, 4.0, dtype);
    EXPECT_FALSE(numerics::unscale_and_check({a, b}, 0.25)) << dtype;
    EXPECT_TRUE(torch::equal(a, torch::full_like(a, 2.0))) << dtype;
    EXPECT_TRUE(torch::equal(b, torch::full_like(b, 1.0))) << dtype;
    a[99999] = kInf;
    EXPECT_TRUE(numerics::unscale_and_check({a, b}, 0.5)) << dtype;
    b[3] = std::nan("");
    EXPECT_TRUE(numerics::has_non_finite({b})) << dtype;
    EXPECT_TRUE(numerics::has_non_finite({a})) << dtype;
  }
}

TEST(NonFinite, CheckOnlyWritesNothingAndSkipsUndefined) {
  auto a = torch::randn({1000});
  const auto before = a.clone();
  EXPECT_FALSE(numerics::has_non_finite({a, torch::Tensor(), torch::empty({0})}));
  EXPECT_TRUE(torch::equal(a, before));
}

TEST(NonFinite, NonContiguousTensors) {
  auto a = torch::full({8, 6}, 2.0).t();
  ASSERT_FALSE(a.is_contiguous());
  EXPECT_FALSE(numerics::unscale_and_check({a}, 0.5));
  EXPECT_TRUE(torch::equal(a, torch::ones_like(a)));
  a[2][5] = -kInf;
  EXPECT_TRUE(numerics::has_non_finite({a}));
}

TEST(NonFinite, OneProcessFlags) {
  EXPECT_EQ(numerics::flags_of_ranks(nullptr, 3), std::vector<int>{3});
  EXPECT_EQ(numerics::ranks_with_flag({0, 2, 0, 1}), (std::vector<int>{1, 3}));
  EXPECT_TRUE(numerics::ranks_with_flag({0, 0}).empty());
}

// With a power-of-two scale and no overflow, scaling and unscaling are exact: a scaled
// run equals an unscaled one bit for bit.
TEST(GradScaler, CleanRunEqualsUnscaledTraining) {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    numerics::GradScaler scaler;
    const auto plain = train(dtype, nullptr, 30);
    const auto scaled = train(dtype, &scaler, 30);
    const double diff = (plain - scaled).abs().max().item<double>();
    EXPECT_EQ(diff, 0.0) << dtype << ": max |difference| " << diff;
    EXPECT_EQ(scaler.get_scale(), 65536.0);
    EXPECT_EQ(scaler.growth_tracker(), 30);
  }
}

TEST(GradScaler, InfSkipsTheStepAndBacksOff) {
  auto net = small_net(torch::kFloat);
  torch::optim::SGD opt(net->parameters(), 0.1);
  numerics::GradScaler scaler;
  auto x = torch::randn({4, 6});
  scaler.scale(net->forward(x).sum()).backward();
  const auto before = net->parameters()[0].detach().clone();
  {
    torch::NoGradGuard ng;
    net->parameters()[0].grad()[0][0] = kInf;
  }
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_EQ(scaler.skipped_ranks(), std::vector<int>{0});
  scaler.update();
  EXPECT_TRUE(torch::equal(net->parameters()[0].detach(), before));
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalGoodSteps) {
  auto w = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD opt({w}, 1e-3);
  numerics::GradScaler scaler;  // defaults: 2^16, x2 every 2000 good steps
  for (int s = 1; s <= 2000; ++s) {
    opt.zero_grad();
    scaler.scale(w.sum()).backward();
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    if (s == 1999) {
      EXPECT_EQ(scaler.get_scale(), 65536.0);
    }
  }
  EXPECT_EQ(scaler.get_scale(), 131072.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, UnscaleBeforeClippingSeesTrueGradients) {
  auto w = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt({w}, 1.0);
  numerics::GradScaler scaler;
  scaler.scale((w * 2).sum()).backward();
  EXPECT_EQ(w.grad()[0].item<float>(), 2.0f * 65536.0f);
  scaler.unscale(opt);
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({3}, 2.0)));
  EXPECT_THROW(scaler.unscale(opt), lockstep::InvalidArgument);  // twice in a step
  EXPECT_TRUE(scaler.step(opt));                                 // does not unscale again
  scaler.update();
  EXPECT_TRUE(torch::equal(w.detach(), torch::full({3}, -1.0)));
}

TEST(GradScaler, GrowthThatOverflowsFloat32IsDropped) {
  numerics::GradScalerOptions o;
  o.init_scale = 3e38;
  o.growth_interval = 1;
  numerics::GradScaler scaler(o);
  auto w = torch::ones({1}, torch::requires_grad());
  torch::optim::SGD opt({w}, 0.0);
  opt.zero_grad();
  scaler.scale(w.sum() * 0).backward();
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 3e38);
}

TEST(GradScaler, DisabledIsPlainTraining) {
  numerics::GradScalerOptions o;
  o.enabled = false;
  numerics::GradScaler scaler(o);
  const auto plain = train(torch::kFloat, nullptr, 5);
  const auto off = train(torch::kFloat, &scaler, 5);
  EXPECT_TRUE(torch::equal(plain, off));
}

TEST(GradScaler, StateRoundTrip) {
  numerics::GradScaler a;
  auto w = torch::ones({1}, torch::requires_grad());
  torch::optim::SGD opt({w}, 0.0);
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    a.scale(w.sum()).backward();
    a.step(opt);
    a.update();
  }
  torch::serialize::OutputArchive out;
  a.save(out);
  std::ostringstream os;
  out.save_to(os);
  std::istringstream is(os.str());
  torch::serialize::InputArchive in;
  in.load_from(is);
  numerics::GradScaler b;
  b.load(in);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), 3);
}

TEST(GradScaler, BadOptionsAreRejected) {
  numerics::GradScalerOptions o;
  o.backoff_factor = 1.5;
  EXPECT_THROW(numerics::GradScaler{o}, lockstep::InvalidArgument);
  o = {};
  o.init_scale = 0;
  EXPECT_THROW(numerics::GradScaler{o}, lockstep::InvalidArgument);
  o = {};
  o.growth_interval = 0;
  EXPECT_THROW(numerics::GradScaler{o}, lockstep::InvalidArgument);
}

}  // namespace
