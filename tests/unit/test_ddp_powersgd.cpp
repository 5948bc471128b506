// The PowerSGD hook on a world of 1: options, PyTorch's seed stream, the orthogonalisation,
// what is compressed and what it costs, layout changes, and the hook inside DDP.
// The multi-rank behaviour (averages, error feedback, replicas, PyTorch's own hook) is
// tests/multiprocess/powersgd_check.cpp.
#include <lockstep/lockstep.h>
#include <lockstep/parallel/ddp/hooks/powersgd_hook.h>

#include "parallel/ddp/hooks/powersgd_linalg.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace {

using lockstep::ddp::GradBucket;
using lockstep::ddp::hooks::powersgd_hook;
using lockstep::ddp::hooks::PowerSgdOptions;
using lockstep::ddp::hooks::PowerSgdState;

std::shared_ptr<lockstep::ProcessGroup> solo() {
  static auto g = lockstep::init();
  return g;
}

std::string error_of(const PowerSgdOptions& o) {
  try {
    PowerSgdState s(o);
  } catch (const lockstep::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

GradBucket bucket_of(const std::vector<std::vector<int64_t>>& shapes, at::ScalarType dt) {
  GradBucket b;
  b.num_buckets = 1;
  b.is_last = true;
  b.world_size = 1;
  int64_t off = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    b.names.push_back("p" + std::to_string(i));
    b.offsets.push_back(off);
    b.numels.push_back(n);
    b.shapes.push_back(shapes[i]);
    b.param_indices.push_back(int64_t(i));
    off += n;
  }
  b.buffer = at::randn({off}, at::TensorOptions().dtype(dt));
  return b;
}

int64_t run(lockstep::ddp::CommHook& hook, GradBucket& b) {
  auto r = hook(*solo(), b);
  r.work->wait();
  if (r.finish) r.finish();
  return r.bytes;
}

TEST(PowerSgd, OptionsNameTheCauseAndTheFix) {
  PowerSgdOptions o;
  o.matrix_approximation_rank = 0;
  EXPECT_NE(error_of(o).find("matrix_approximation_rank = 0"), std::string::npos);
  o = {};
  o.start_iter = 1;  // PyTorch's rule: error feedback or warm start need >= 2
  EXPECT_NE(error_of(o).find("start_iter = 1"), std::string::npos) << error_of(o);
  EXPECT_NE(error_of(o).find("turn both off"), std::string::npos);
  o.use_error_feedback = o.warm_start = false;
  EXPECT_EQ(error_of(o), "");
  o = {};
  o.min_compression_rate = -1;
  EXPECT_NE(error_of(o).find("min_compression_rate"), std::string::npos);
  o = {};
  o.orthogonalization_epsilon = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(error_of(o).find("orthogonalization_epsilon"), std::string::npos);
}

// numpy.random.RandomState(s).randint(1_000_000_000), three draws (numpy 2.4).
TEST(PowerSgd, SeedsAreNumpysRandint) {
  const std::vector<std::pair<uint32_t, std::vector<uint32_t>>> want{
      {0, {209652396, 398764591, 924231285}},
      {7, {327741615, 976413892, 128500249}},
      {123, {843828734, 914636141, 155217278}},
      {4294967295u, {419326371, 479346978, 697429004}}};
  for (const auto& [seed, draws] : want) {
    std::mt19937 mt(seed);
    for (uint32_t d : draws) EXPECT_EQ(lockstep::ddp::hooks::powersgd::draw_seed(mt), d) << seed;
  }
}

TEST(PowerSgd, OrthogonalizeGramSchmidtAndQr) {
  for (int64_t r : {1, 2, 3, 5}) {  // Gram-Schmidt up to 2, QR above
    at::Tensor m = at::randn({17, r}, at::kDouble);
    at::Tensor before = m.clone();
    lockstep::ddp::hooks::powersgd::orthogonalize(m, 0);
    EXPECT_TRUE(at::allclose(at::mm(m.t(), m), at::eye(r, at::kDouble), 0, 1e-12)) << r;
    // Same span: projecting the input onto the columns keeps it.
    EXPECT_TRUE(at::allclose(at::mm(m, at::mm(m.t(), before)), before, 0, 1e-12)) << r;
  }
}

TEST(PowerSgd, ZeroColumnBecomesZerosNotNaN) {
  at::Tensor m = at::zeros({6, 2}, at::kFloat);
  m.select(1, 1).fill_(2);
  lockstep::ddp::hooks::powersgd::orthogonalize(m, 0);
  EXPECT_FALSE(m.isnan().any().item<bool>());
  EXPECT_EQ(m.select(1, 0).abs().sum().item<float>(), 0.f);
  EXPECT_NEAR(m.select(1, 1).norm().item<float>(), 1.f, 1e-6);
  at::Tensor e = at::zeros({6, 2}, at::kFloat);
  lockstep::ddp::hooks::powersgd::orthogonalize(e, 1e-8);
  EXPECT_FALSE(e.isnan().any().item<bool>());
}

// Plain allreduce (and no state) before start_iter; then r (n + m) elements for the matrix
// and the vector in full; the step counter advances at each step's last bucket only.
TEST(PowerSgd, WhatIsCompressedAndItsBytes) {
  PowerSgdOptions o;
  o.start_iter = 2;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  GradBucket b = bucket_of({{16, 24}, {24}, {3, 4}}, at::kFloat);
  // 3 x 4 at rank 1: (3 + 4) * 2 = 14 >= 12, not worth it.
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(run(hook, b), (384 + 24 + 12) * 4);
    EXPECT_EQ(state->bucket(0), nullptr);
  }
  EXPECT_EQ(state->iter(), 2);
  EXPECT_EQ(run(hook, b), (24 + 12 + 16 + 24) * 4);
  ASSERT_NE(state->bucket(0), nullptr);
  EXPECT_EQ(state->bucket(0)->p.numel(), 16);
  EXPECT_EQ(state->bucket(0)->q.numel(), 24);
  EXPECT_EQ(state->bucket(0)->error.numel(), b.buffer.numel());
  b.is_last = false;  // not the last bucket: the step goes on
  run(hook, b);
  EXPECT_EQ(state->iter(), 3);
  state->set_iter(0);
  b.is_last = true;
  EXPECT_EQ(run(hook, b), (384 + 24 + 12) * 4);
}

// On one rank the vector is left as it was, the matrix replaced by its rank-1 approximation
// (P Q^T with Q = M^T P: the projection onto P), and input = result + error exactly.
TEST(PowerSgd, OneRankErrorIsWhatTheApproximationLeftOut) {
  PowerSgdOptions o;
  o.start_iter = 2;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  GradBucket b = bucket_of({{16, 24}, {24}}, at::kDouble);
  for (int step = 0; step < 3; ++step) run(hook, b);
  at::Tensor in = at::randn_like(b.buffer);
  b.buffer.copy_(in);
  at::Tensor carried = state->bucket(0)->error.clone();
  run(hook, b);
  EXPECT_TRUE(at::equal(b.buffer.narrow(0, 384, 24), (in + carried).narrow(0, 384, 24)));
  at::Tensor approx = b.buffer.narrow(0, 0, 384).view({16, 24});
  EXPECT_LT(at::linalg_matrix_rank(approx).item<int64_t>(), 2);
  EXPECT_TRUE(at::allclose(in + carried, b.buffer + state->bucket(0)->error, 0, 1e-12));
}

TEST(PowerSgd, NewLayoutStartsAfresh) {
  PowerSgdOptions o;
  o.start_iter = 2;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  GradBucket a = bucket_of({{16, 24}}, at::kFloat);
  for (int step = 0; step < 3; ++step) run(hook, a);
  auto before = state->bucket(0);
  GradBucket b = bucket_of({{24, 16}, {8}}, at::kFloat);  // e.g. after a rebuild
  run(hook, b);
  ASSERT_NE(state->bucket(0), before);
  EXPECT_EQ(state->bucket(0)->error.numel(), 24 * 16 + 8);
  EXPECT_EQ(state->bucket(0)->q.numel(), 16);
  EXPECT_FALSE(b.buffer.isnan().any().item<bool>());
}

// A NaN gradient makes the step's result NaN; the error and Q it would leave behind are
// dropped, so the next finite step is finite again (PyTorch's hook would stay NaN).
TEST(PowerSgd, NonFiniteStepDoesNotPoisonTheNext) {
  PowerSgdOptions o;
  o.start_iter = 2;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  GradBucket b = bucket_of({{16, 24}, {24}}, at::kFloat);
  for (int step = 0; step < 3; ++step) run(hook, b);
  b.buffer[5] = NAN;
  run(hook, b);
  EXPECT_TRUE(b.buffer.isnan().any().item<bool>());
  EXPECT_FALSE(state->bucket(0)->error.defined());
  EXPECT_FALSE(state->bucket(0)->q.defined());
  b.buffer.copy_(at::randn_like(b.buffer));
  run(hook, b);
  EXPECT_TRUE(b.buffer.isfinite().all().item<bool>());
  EXPECT_TRUE(state->bucket(0)->error.isfinite().all().item<bool>());
}

TEST(PowerSgd, OtherDtypesGoUncompressed) {
  PowerSgdOptions o;
  o.start_iter = 2;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  GradBucket b = bucket_of({{16, 24}}, at::kBFloat16);
  at::Tensor in = b.buffer.clone();
  for (int step = 0; step < 3; ++step) EXPECT_EQ(run(hook, b), 384 * 2);
  EXPECT_TRUE(at::equal(in, b.buffer));
  EXPECT_EQ(state->bucket(0), nullptr);
}

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// Inside DDP (bucket rebuild after the first step included): at a rank >= every min(n, m)
// the gradients are the exact ones, compressed steps included.
TEST(PowerSgd, InsideDdpAtFullRankGradientsAreExact) {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  auto ref = std::make_shared<Net>();
  {
    torch::NoGradGuard g;
    auto a = ref->parameters(), b = net->parameters();
    for (size_t i = 0; i < a.size(); ++i) a[i].copy_(b[i]);
  }
  lockstep::DistributedDataParallel<Net> ddp(net, solo());
  PowerSgdOptions o;
  o.matrix_approximation_rank = 8;
  o.start_iter = 2;
  o.min_compression_rate = 0;  // biases too
  auto state = std::make_shared<PowerSgdState>(o);
  ddp.register_comm_hook(powersgd_hook(state));
  double worst = 0;
  for (int step = 0; step < 4; ++step) {
    at::Tensor x = torch::randn({5, 8});
    net->zero_grad();
    ref->zero_grad();
    ddp.forward(x).pow(2).sum().backward();
    ref->forward(x).pow(2).sum().backward();
    auto a = net->parameters(), b = ref->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, (a[i].grad() - b[i].grad()).abs().max().item<double>());
  }
  EXPECT_EQ(state->iter(), 4);
  EXPECT_NE(state->bucket(0), nullptr);
  EXPECT_LT(worst, 1e-4) << "max diff " << worst;
  std::printf("PowerSGD in DDP at full rank: max diff to the exact gradients %.3g\n", worst);
}

}  // namespace
