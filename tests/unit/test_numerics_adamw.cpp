// AnyPrecision AdamW: equal to torch::optim::AdamW with fp32/fp64 states and Kahan off;
// closer to fp32 training than plain bf16 AdamW with Kahan on; state round trips through
// torch archives bit for bit; bad options are refused by name.
#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/numerics/anyprecision_adamw.h>

#include <gtest/gtest.h>

#include <torch/torch.h>
#include "tensor_diff.h"

#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using lockstep::numerics::AnyPrecisionAdamW;
using lockstep::numerics::AnyPrecisionAdamWOptions;
using torch::Tensor;

// A small MLP as a list of tensors: 8 -> 16 (tanh) -> 4.
std::vector<Tensor> make_mlp(c10::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<Tensor> ps = {torch::randn({16, 8}) * 0.5, torch::randn({16}) * 0.1,
                            torch::randn({4, 16}) * 0.5, torch::randn({4}) * 0.1};
  for (auto& p : ps) p = p.to(dtype).requires_grad_(true);
  return ps;
}

std::vector<Tensor> clone_params(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// Mean squared error by hand: libtorch 1.13 has no bf16 mse_loss kernel on CPU.
Tensor mse(const Tensor& pred, const Tensor& target) { return (pred - target).square().mean(); }

Tensor mlp_loss(const std::vector<Tensor>& ps, int step) {
  torch::manual_seed(1000 + step);
  const auto dtype = ps[0].scalar_type();
  auto x = torch::randn({32, 8}).to(dtype);
  auto y = torch::randn({32, 4}).to(dtype);
  auto h = torch::tanh(torch::linear(x, ps[0], ps[1]));
  return mse(torch::linear(h, ps[2], ps[3]), y);
}

using lockstep::testing::max_diff;

void train(torch::optim::Optimizer& opt, const std::vector<Tensor>& ps, int first, int steps) {
  for (int s = first; s < first + steps; ++s) {
    opt.zero_grad();
    mlp_loss(ps, s).backward();
    opt.step();
  }
}

// Two param groups (the second without weight decay), 50 steps, against torch's AdamW.
double diff_to_torch_adamw(c10::ScalarType dtype) {
  auto ref = make_mlp(dtype, 7);
  auto mine = clone_params(ref);
  const double lr = 1e-2, wd = 0.05;
  const auto betas = std::make_tuple(0.9, 0.99);
  auto tg = [&](std::vector<Tensor> ps, double decay) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(lr);
    o->betas(betas).eps(1e-7).weight_decay(decay);
    return torch::optim::OptimizerParamGroup(std::move(ps), std::move(o));
  };
  auto mg = [&](std::vector<Tensor> ps, double decay) {
    auto o = std::make_unique<AnyPrecisionAdamWOptions>(lr);
    o->betas(betas).eps(1e-7).weight_decay(decay).momentum_dtype(dtype).variance_dtype(dtype);
    return torch::optim::OptimizerParamGroup(std::move(ps), std::move(o));
  };
  torch::optim::AdamW ref_opt({tg({ref[0], ref[1]}, wd), tg({ref[2], ref[3]}, 0)});
  AnyPrecisionAdamW opt({mg({mine[0], mine[1]}, wd), mg({mine[2], mine[3]}, 0)});
  for (int s = 0; s < 50; ++s) {
    ref_opt.zero_grad();
    mlp_loss(ref, s).backward();
    ref_opt.step();
    // The closure path: step() evaluates the loss with grad enabled.
    opt.zero_grad();
    opt.step([&] {
      auto loss = mlp_loss(mine, s);
      loss.backward();
      return loss;
    });
  }
  return max_diff(ref, mine);
}

TEST(AnyPrecisionAdamW, EqualsTorchAdamWInFloat32) {
  const double d = diff_to_torch_adamw(torch::kFloat);
  std::printf("float32, 50 steps: max |p - p_torch_adamw| = %.3g (tolerance 1e-6)\n", d);
  EXPECT_LE(d, 1e-6);
}

TEST(AnyPrecisionAdamW, EqualsTorchAdamWInFloat64) {
  const double d = diff_to_torch_adamw(torch::kDouble);
  std::printf("float64, 50 steps: max |p - p_torch_adamw| = %.3g (tolerance 1e-12)\n", d);
  EXPECT_LE(d, 1e-12);
}

// --- pure bf16 with and without Kahan, against fp32 AdamW ---------------------------------

// Linear regression y = X w* (64 features): weights start near 1, where a bf16 ulp is
// 2^-7, and lr = 1e-3 makes most single updates smaller than half an ulp.
struct Regression {
  Tensor x, y;
  Regression() {
    torch::manual_seed(3);
    x = torch::randn({256, 64});
    y = torch::matmul(x, torch::randn({64}) * 0.5 + 1.0);
  }
  Tensor loss(const Tensor& w) const {
    return mse(torch::matmul(x.to(w.scalar_type()), w), y.to(w.scalar_type()));
  }
  double loss_fp32(const Tensor& w) const {
    return loss(w.detach().to(torch::kFloat)).item<double>();
  }
};

Tensor fit(const Regression& r, torch::optim::Optimizer& opt, const Tensor& w, int steps) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    r.loss(w).backward();
    opt.step();
  }
  return w.detach().to(torch::kFloat);
}

Tensor initial_weights() {
  torch::manual_seed(4);
  return torch::randn({64}) * 0.5 + 1.0;
}

Tensor fit_bf16(const Regression& r, bool kahan, int steps) {
  auto w = initial_weights().to(torch::kBFloat16).requires_grad_(true);
  AnyPrecisionAdamW opt({w}, AnyPrecisionAdamWOptions(1e-3)
                                 .weight_decay(0)
                                 .use_kahan_summation(kahan)
                                 .momentum_dtype(torch::kBFloat16)
                                 .variance_dtype(torch::kBFloat16)
                                 .compensation_buffer_dtype(torch::kBFloat16));
  auto out = fit(r, opt, w, steps);
  EXPECT_EQ(w.scalar_type(), torch::kBFloat16);
  const auto& s = static_cast<const lockstep::numerics::AnyPrecisionAdamWParamState&>(
      *opt.state().begin()->second);
  EXPECT_EQ(s.exp_avg().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(s.exp_avg_sq().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(s.compensation().defined(), kahan);
  return out;
}

TEST(AnyPrecisionAdamW, KahanInBf16StaysCloserToFp32) {
  Regression r;
  const int steps = 400;
  auto w32 = initial_weights().requires_grad_(true);
  torch::optim::AdamW ref({w32}, torch::optim::AdamWOptions(1e-3).weight_decay(0));
  const Tensor ref_w = fit(r, ref, w32, steps);
  const Tensor plain = fit_bf16(r, false, steps);
  const Tensor kahan = fit_bf16(r, true, steps);
  const double l32 = r.loss_fp32(ref_w), l0 = r.loss_fp32(initial_weights());
  const double dl_plain = std::abs(r.loss_fp32(plain) - l32);
  const double dl_kahan = std::abs(r.loss_fp32(kahan) - l32);
  const double dp_plain = (plain - ref_w).abs().max().item<double>();
  const double dp_kahan = (kahan - ref_w).abs().max().item<double>();
  std::printf("loss: start %.5f, fp32 AdamW %.5f, bf16 %.5f, bf16+Kahan %.5f\n", l0, l32,
              r.loss_fp32(plain), r.loss_fp32(kahan));
  std::printf(
      "distance to fp32 AdamW after %d steps: loss %.4g (bf16) vs %.4g (bf16+Kahan); "
      "max param %.4g vs %.4g\n",
      steps, dl_plain, dl_kahan, dp_plain, dp_kahan);
  EXPECT_LT(l32, 0.5 * l0);             // the problem is learnt at all
  EXPECT_LT(dl_kahan, 0.5 * dl_plain);  // "measurably closer": at least 2x
  EXPECT_LT(dp_kahan, 0.5 * dp_plain);
}

// --- mixed dtypes -------------------------------------------------------------------------

TEST(AnyPrecisionAdamW, MixedDtypesStepAndKeepTheirDtypes) {
  // bf16 parameters with fp32 states, Kahan with a fp32 buffer, and an fp32 gradient set by
  // hand; fp32 parameters with bf16 states; fp64 parameters with the default fp32 states.
  auto a = torch::ones({5}, torch::kBFloat16).requires_grad_(true);
  auto b = torch::ones({5}).requires_grad_(true);
  auto c = torch::ones({5}, torch::kDouble).requires_grad_(true);
  AnyPrecisionAdamW oa({a}, AnyPrecisionAdamWOptions(1e-2).use_kahan_summation(true));
  AnyPrecisionAdamW ob({b}, AnyPrecisionAdamWOptions(1e-2)
                                .momentum_dtype(torch::kBFloat16)
                                .variance_dtype(torch::kBFloat16));
  AnyPrecisionAdamW oc({c}, AnyPrecisionAdamWOptions(1e-2));
  a.mutable_grad() = torch::full({5}, 0.5);
  b.mutable_grad() = torch::full({5}, 0.5);
  c.mutable_grad() = torch::full({5}, 0.5, torch::kDouble);
  for (int s = 0; s < 3; ++s) {
    oa.step();
    ob.step();
    oc.step();
  }
  EXPECT_EQ(a.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(b.scalar_type(), torch::kFloat);
  EXPECT_EQ(c.scalar_type(), torch::kDouble);
  // Adam's first steps move each weight by about lr (after weight decay 1e-4 per step).
  for (const Tensor& p : {a, b, c}) {
    const double moved = 1.0 - p.detach().to(torch::kDouble).mean().item<double>();
    EXPECT_NEAR(moved, 0.03, 2e-3) << p.scalar_type();
  }
  const auto& sa = static_cast<const lockstep::numerics::AnyPrecisionAdamWParamState&>(
      *oa.state().begin()->second);
  EXPECT_EQ(sa.compensation().scalar_type(), torch::kFloat);
}

// --- save / load ------------------------------------------------------------------------

AnyPrecisionAdamWOptions bf16_kahan_options() {
  return AnyPrecisionAdamWOptions(3e-3)
      .betas({0.8, 0.95})
      .weight_decay(0.1)
      .use_kahan_summation(true)
      .momentum_dtype(torch::kBFloat16)
      .variance_dtype(torch::kFloat)
      .compensation_buffer_dtype(torch::kBFloat16);
}

TEST(AnyPrecisionAdamW, SaveLoadContinuesBitForBit) {
  auto ps = make_mlp(torch::kBFloat16, 11);
  AnyPrecisionAdamW opt(ps, bf16_kahan_options());
  train(opt, ps, 0, 10);
  std::stringstream archive;
  torch::save(opt, archive);

  auto resumed = clone_params(ps);
  AnyPrecisionAdamW opt2(resumed, bf16_kahan_options());
  torch::load(opt2, archive);
  ASSERT_EQ(opt2.state().size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto key = [&](const Tensor& t) {
      return lockstep::compat::optimizer_state_key(opt.state(), t);
    };
    const auto& s1 = static_cast<const lockstep::numerics::AnyPrecisionAdamWParamState&>(
        *opt.state().at(key(ps[i])));
    const auto& s2 = static_cast<const lockstep::numerics::AnyPrecisionAdamWParamState&>(
        *opt2.state().at(key(resumed[i])));
    EXPECT_TRUE(s1 == s2) << "state of parameter " << i;
    EXPECT_EQ(s2.step(), 10);
    EXPECT_EQ(s2.exp_avg().scalar_type(), torch::kBFloat16);
    EXPECT_EQ(s2.exp_avg_sq().scalar_type(), torch::kFloat);
  }
  train(opt, ps, 10, 10);
  train(opt2, resumed, 10, 10);
  const double d = max_diff(ps, resumed);
  std::printf("after 10 steps, save, load and 10 more: max |p - p_resumed| = %g\n", d);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(torch::equal(ps[i], resumed[i])) << i;
}

TEST(AnyPrecisionAdamW, OptionsRoundTripThroughAnArchive) {
  const auto o = bf16_kahan_options();
  torch::serialize::OutputArchive out;
  o.serialize(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  AnyPrecisionAdamWOptions back(0);
  back.serialize(in);
  EXPECT_TRUE(back == o);
  EXPECT_EQ(back.variance_dtype(), torch::kFloat);
  EXPECT_EQ(back.compensation_buffer_dtype(), torch::kBFloat16);
}

TEST(AnyPrecisionAdamW, DefaultsAreTorchAdamWs) {
  const AnyPrecisionAdamWOptions o;
  const torch::optim::AdamWOptions t;
  EXPECT_EQ(o.lr(), t.lr());
  EXPECT_EQ(o.betas(), t.betas());
  EXPECT_EQ(o.eps(), t.eps());
  EXPECT_EQ(o.weight_decay(), t.weight_decay());
  EXPECT_FALSE(o.use_kahan_summation());
  EXPECT_EQ(o.momentum_dtype(), torch::kFloat);
}

// --- bad options --------------------------------------------------------------------------

std::string construct_error(const AnyPrecisionAdamWOptions& o) {
  auto p = torch::zeros({2}, torch::requires_grad());
  try {
    AnyPrecisionAdamW opt({p}, o);
  } catch (const lockstep::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(AnyPrecisionAdamW, BadOptionsAreNamed) {
  using O = AnyPrecisionAdamWOptions;
  const std::vector<std::pair<O, std::string>> cases = {
      {O(-1), "lr"},
      {O().eps(-1e-8), "eps"},
      {O().weight_decay(-0.1), "weight_decay"},
      {O().betas({1.0, 0.999}), "betas[0]"},
      {O().betas({0.9, -0.5}), "betas[1]"},
      {O().momentum_dtype(torch::kInt), "momentum_dtype"},
      {O().variance_dtype(torch::kLong), "variance_dtype"},
      {O().compensation_buffer_dtype(torch::kBool), "compensation_buffer_dtype"},
  };
  for (const auto& [o, name] : cases) {
    const std::string e = construct_error(o);
    EXPECT_NE(e.find("option " + name), std::string::npos) << name << ": '" << e << "'";
  }
  EXPECT_EQ(construct_error(O()), "");
}

TEST(AnyPrecisionAdamW, Float16OnCpuIsRefusedAtStep) {
  auto p = torch::ones({3}).requires_grad_(true);
  AnyPrecisionAdamW opt({p}, AnyPrecisionAdamWOptions().momentum_dtype(torch::kHalf));
  p.mutable_grad() = torch::ones({3});
  try {
    opt.step();
    ADD_FAILURE() << "float16 states on CPU were accepted";
  } catch (const lockstep::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();
  }
}

TEST(AnyPrecisionAdamW, OptionsChangedAfterConstructionAreCheckedAtStep) {
  auto p = torch::ones({3}).requires_grad_(true);
  AnyPrecisionAdamW opt({p});
  p.mutable_grad() = torch::ones({3});
  static_cast<AnyPrecisionAdamWOptions&>(opt.param_groups()[0].options()).lr(-1);
  EXPECT_THROW(opt.step(), lockstep::InvalidArgument);
}

}  // namespace
