// lockstep::numerics::activation_checkpoint and lockstep::numerics::Checkpointed: the same outputs
// and gradients as a plain forward/backward (bit for bit in float32 and under bf16 autocast on the
// CPU, dropout included), the parameters' accumulator hooks firing once, the RNG stream untouched
// by the recomputation, activations not kept, and the errors of the contract.
#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/numerics/activation_checkpoint.h>
#include <lockstep/numerics/autocast.h>

#include <gtest/gtest.h>

#include <torch/torch.h>
#include "tensor_diff.h"

#include <cstdio>
#include <map>
#include <string>

namespace {

using lockstep::numerics::activation_checkpoint;
using TensorVec = std::vector<torch::Tensor>;

// An MLP block with dropout: the recomputation must draw the same mask.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t d = 16, double p = 0.3) {
    fc1 = register_module("fc1", torch::nn::Linear(d, 2 * d));
    drop = register_module("drop", torch::nn::Dropout(p));
    fc2 = register_module("fc2", torch::nn::Linear(2 * d, d));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(drop(torch::gelu(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

using lockstep::testing::max_diff;

bool identical(const TensorVec& a, const TensorVec& b, const char* what) {
  const double d = max_diff(a, b);
  std::printf("%s: max |checkpointed - plain| = %.3g\n", what, d);
  if (d != 0) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].defined() && !torch::equal(a[i], b[i])) return false;
  return true;
}

TensorVec grads_of(const TensorVec& ts) {
  TensorVec g;
  for (const auto& t : ts) g.push_back(t.grad().defined() ? t.grad().clone() : torch::Tensor());
  return g;
}

void zero_grads(const TensorVec& ts) {
  for (auto t : ts)
    if (t.grad().defined()) t.mutable_grad() = torch::Tensor();
}

struct BlockRun {
  torch::Tensor out;
  TensorVec grads;  // params then x
};

// One forward/backward of `block` on x (same seed for both variants), checkpointed or not.
BlockRun run_block(Mlp block, const torch::Tensor& x, bool ckpt, bool autocast) {
  auto params = block->parameters();
  zero_grads(params);
  zero_grads({x});
  torch::manual_seed(42);
  BlockRun r;
  {
    c10::optional<lockstep::numerics::Autocast> ac;
    if (autocast) ac.emplace();
    r.out = ckpt ? activation_checkpoint(
                       [&](const torch::Tensor& in) { return block->forward(in); }, x, params)
                 : block->forward(x);
  }
  r.out.pow(2).sum().backward();
  params.push_back(x);
  r.grads = grads_of(params);
  return r;
}

TEST(Checkpoint, MlpWithDropoutIsBitIdenticalInFloat32) {
  torch::manual_seed(0);
  Mlp block;
  auto x = torch::randn({8, 16}).requires_grad_(true);
  const BlockRun plain = run_block(block, x, false, false);
  const BlockRun ck = run_block(block, x, true, false);
  EXPECT_TRUE(identical({ck.out}, {plain.out}, "fp32 output"));
  EXPECT_TRUE(identical(ck.grads, plain.grads, "fp32 gradients"));
  // Dropout is active: another seed gives another output, so the mask matters.
  torch::manual_seed(43);
  EXPECT_FALSE(torch::equal(block->forward(x), plain.out));
}

TEST(Checkpoint, UnderBf16AutocastIsBitIdentical) {
  for (double p : {0.0, 0.3}) {  // autocast alone (the recomputation runs in bf16 too), + dropout
    torch::manual_seed(1);
    Mlp block(16, p);
    auto x = torch::randn({8, 16}).requires_grad_(true);
    const BlockRun plain = run_block(block, x, false, true);
    const BlockRun ck = run_block(block, x, true, true);
    EXPECT_EQ(plain.out.scalar_type(), torch::kFloat);  // x + bf16 -> promoted
    EXPECT_TRUE(identical({ck.out}, {plain.out}, "bf16 autocast output"));
    EXPECT_TRUE(identical(ck.grads, plain.grads, "bf16 autocast gradients"));
    EXPECT_FALSE(lockstep::numerics::is_enabled());  // the recomputation's guard is gone
  }
}

TEST(Checkpoint, InputWithoutRequiresGrad) {
  torch::manual_seed(2);
  Mlp block;
  auto x = torch::randn({8, 16});
  const BlockRun plain = run_block(block, x, false, false);
  const BlockRun ck = run_block(block, x, true, false);
  EXPECT_TRUE(ck.out.requires_grad());
  EXPECT_FALSE(ck.grads.back().defined());  // x has no gradient
  EXPECT_TRUE(identical(ck.grads, plain.grads, "no-grad input: gradients"));
}

TEST(Checkpoint, MultipleInputsAndOutputsSomeUnusedOrNotDifferentiable) {
  torch::manual_seed(3);
  auto w = torch::randn({6, 6}, torch::kDouble).requires_grad_(true);
  auto a = torch::randn({4, 6}, torch::kDouble).requires_grad_(true);
  auto b = torch::randn({4, 6}, torch::kDouble).requires_grad_(true);
  auto idx = torch::arange(4);  // an integer input passes through untouched
  auto fn = [&](const TensorVec& in) {
    auto h = torch::tanh(in[0].matmul(w) + in[1]);
    return TensorVec{h * in[1], torch::sigmoid(h), h.argmax(1) + in[2], h.sum()};
  };
  auto loss_of = [](const TensorVec& o) { return (o[0].pow(2)).sum() + o[3]; };  // o[1] unused
  auto plain = fn({a, b, idx});
  loss_of(plain).backward();
  const TensorVec g_plain = grads_of({w, a, b});
  zero_grads({w, a, b});
  auto ck = activation_checkpoint(fn, {a, b, idx}, {w});
  ASSERT_EQ(ck.size(), 4u);
  EXPECT_FALSE(ck[2].requires_grad());
  EXPECT_EQ(ck[2].scalar_type(), torch::kLong);
  EXPECT_TRUE(identical(ck, plain, "multi-output values"));
  loss_of(ck).backward();
  EXPECT_TRUE(identical(grads_of({w, a, b}), g_plain, "multi-input gradients"));
}

TEST(Checkpoint, NestedCheckpoints) {
  torch::manual_seed(4);
  Mlp inner1, inner2;
  auto x = torch::randn({5, 16}).requires_grad_(true);
  auto params = inner1->parameters();
  for (const auto& p : inner2->parameters()) params.push_back(p);
  auto two_blocks = [&](const torch::Tensor& in) {
    auto h = activation_checkpoint([&](const torch::Tensor& t) { return inner1->forward(t); }, in,
                                   inner1->parameters());
    return inner2->forward(torch::relu(h));
  };
  torch::manual_seed(7);
  two_blocks(x).sum().backward();
  TensorVec all = params;
  all.push_back(x);
  const TensorVec g_plain = grads_of(all);
  zero_grads(all);
  torch::manual_seed(7);
  activation_checkpoint(two_blocks, x, params).sum().backward();
  EXPECT_TRUE(identical(grads_of(all), g_plain, "nested gradients"));
}

TEST(Checkpoint, WrapperInsideSequentialKeepsNamesAndGradients) {
  torch::manual_seed(5);
  auto c1 = lockstep::numerics::checkpoint_wrapper(torch::nn::Linear(16, 16));
  auto c2 = lockstep::numerics::checkpoint_wrapper(Mlp());
  torch::nn::Sequential net(c1, torch::nn::ReLU(), c2);
  const std::vector<std::string> expected = {"0.weight",   "0.bias",       "2.fc1.weight",
                                             "2.fc1.bias", "2.fc2.weight", "2.fc2.bias"};
  EXPECT_EQ(net->named_parameters().keys(), expected);
  auto x = torch::randn({4, 16});
  auto run = [&](bool on) {
    c1->set_enabled(on);
    c2->set_enabled(on);
    zero_grads(net->parameters());
    torch::manual_seed(9);
    auto out = net->forward(x);
    out.pow(2).mean().backward();
    TensorVec r = grads_of(net->parameters());
    r.push_back(out.detach());
    return r;
  };
  const TensorVec plain = run(false);
  EXPECT_TRUE(identical(run(true), plain, "Sequential of wrappers"));
  // A plain model loads the wrapped model's state dict by name.
  torch::nn::Sequential bare(torch::nn::Linear(16, 16), torch::nn::ReLU(), Mlp());
  EXPECT_EQ(bare->named_parameters().keys(), expected);
}

TEST(Checkpoint, AccumulatorHooksFireOncePerParameterPerBackward) {
  torch::manual_seed(6);
  Mlp block;
  auto params = block->parameters();
  std::map<size_t, int> fired;
  std::vector<lockstep::compat::PostHookHandle> hooks;
  for (size_t i = 0; i < params.size(); ++i)
    hooks.push_back(lockstep::compat::add_grad_ready_hook(params[i], [&fired, i] { ++fired[i]; }));
  auto x = torch::randn({3, 16});
  for (int step = 1; step <= 2; ++step) {
    // Nested too: the inner checkpoint's parameters are a subset of the outer's.
    auto y = activation_checkpoint(
        [&](const torch::Tensor& in) {
          auto h = activation_checkpoint([&](const torch::Tensor& t) { return block->fc1(t); }, in,
                                         block->fc1->parameters());
          return block->fc2(torch::relu(h));
        },
        x, params);
    y.sum().backward();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(fired[i], step) << "parameter " << i;
      EXPECT_TRUE(params[i].grad().defined());
    }
  }
  for (auto& h : hooks) lockstep::compat::remove_hook(h);
}

TEST(Checkpoint, UndeclaredLeafIsAnErrorNamingIt) {
  auto w = torch::randn({3, 7}).requires_grad_(true);
  auto x = torch::randn({2, 3}).requires_grad_(true);
  // w is not declared as a parameter:
  auto y = activation_checkpoint([&](const torch::Tensor& in) { return in.matmul(w); }, x);
  try {
    y.sum().backward();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const lockstep::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[3, 7]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("params"), std::string::npos) << msg;
  }
}

TEST(Checkpoint, RngStateAfterBackwardIsAsBefore) {
  torch::manual_seed(8);
  Mlp block(16, 0.5);
  auto x = torch::randn({8, 16}).requires_grad_(true);
  auto y = activation_checkpoint([&](const torch::Tensor& in) { return block->forward(in); }, x,
                                 block->parameters());
  const auto gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor before = gen.get_state();
  y.sum().backward();
  EXPECT_TRUE(torch::equal(gen.get_state(), before));
}

TEST(Checkpoint, ActivationsAreNotKeptUntilBackward) {
  // A weak reference to an intermediate of the block's first run: autograd keeps it
  // alive (tanh saves its result) without checkpointing, and nothing does with it.
  torch::manual_seed(10);
  torch::nn::Linear a(32, 64), b(64, 32);
  auto x = torch::randn({16, 32}).requires_grad_(true);
  auto expired_after_forward = [&](bool ckpt) {
    c10::weak_intrusive_ptr<c10::TensorImpl> probe(c10::intrusive_ptr<c10::TensorImpl>{});
    bool first = true;
    auto fn = [&](const torch::Tensor& in) {
      auto h = torch::tanh(a(in));
      if (first) probe = c10::weak_intrusive_ptr<c10::TensorImpl>(h.getIntrusivePtr());
      first = false;
      return b(h);
    };
    auto params = a->parameters();
    for (const auto& p : b->parameters()) params.push_back(p);
    auto y = ckpt ? activation_checkpoint(fn, x, params) : fn(x);
    const bool expired = probe.expired();
    y.sum().backward();
    return expired;
  };
  EXPECT_FALSE(expired_after_forward(false));
  EXPECT_TRUE(expired_after_forward(true));
}

TEST(Checkpoint, ModifyingTheInputInsideIsAnError) {
  auto w = torch::randn({4, 4}).requires_grad_(true);
  auto x = torch::randn({2, 4});
  EXPECT_THROW(
      activation_checkpoint([&](const torch::Tensor& in) { return in.mul_(2).matmul(w); }, x, {w}),
      lockstep::InvalidArgument);
}

TEST(Checkpoint, DoubleBackwardIsAnError) {
  auto w = torch::randn({4, 4}).requires_grad_(true);
  auto x = torch::randn({2, 4}).requires_grad_(true);
  auto y = activation_checkpoint([&](const torch::Tensor& in) { return torch::tanh(in.matmul(w)); },
                                 x, {w});
  EXPECT_THROW(torch::autograd::grad({y.sum()}, {x}, {}, true, /*create_graph=*/true),
               lockstep::InvalidArgument);
}

TEST(Checkpoint, WithoutGradModeItIsAPlainCall) {
  auto w = torch::randn({4, 4}).requires_grad_(true);
  torch::NoGradGuard no_grad;
  auto y = activation_checkpoint([&](const torch::Tensor& in) { return in.matmul(w); },
                                 torch::ones({1, 4}), {w});
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(torch::equal(y, torch::ones({1, 4}).matmul(w)));
}

}  // namespace
