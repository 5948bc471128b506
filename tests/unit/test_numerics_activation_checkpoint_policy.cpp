// Selective activation checkpointing (lockstep::numerics::CheckpointPolicy) and
// lockstep::numerics::dropout's kept masks: a stack of transformer layers with dropout gives
// bit-identical outputs and gradients with every policy (whole layers, attention or MLP sub-blocks,
// every k-th layer, masks kept or drawn again) as without checkpointing, in float32, float64 and
// under bf16 autocast; lockstep::numerics::dropout is torch::dropout outside a checkpoint; a
// recomputation that does not repeat the forward's dropout calls is an error.
#include <lockstep/error.h>
#include <lockstep/numerics/activation_checkpoint.h>
#include <lockstep/numerics/activation_checkpoint_policy.h>
#include <lockstep/numerics/autocast.h>
#include <lockstep/numerics/dropout.h>

#include <gtest/gtest.h>

#include <torch/torch.h>
#include "tensor_diff.h"

#include <cmath>
#include <cstdio>
#include <string>

namespace {

using lockstep::numerics::CheckpointBlocks;
using lockstep::numerics::CheckpointPolicy;
using lockstep::numerics::LayerCheckpointing;
using TensorVec = std::vector<torch::Tensor>;

// Pre-norm causal self-attention with dropout on the attention weights and the output.
struct AttnImpl : torch::nn::Module {
  AttnImpl(int64_t d, int64_t heads, double p) : heads(heads) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj = register_module("proj", torch::nn::Linear(d, d));
    drop = register_module("drop", lockstep::numerics::Dropout(p));
  }
  torch::Tensor forward(const torch::Tensor& h) {
    const int64_t B = h.size(0), L = h.size(1), D = h.size(2), dh = D / heads;
    auto t = qkv(ln(h)).view({B, L, 3, heads, dh}).permute({2, 0, 3, 1, 4});
    auto s = t[0].matmul(t[1].transpose(-2, -1)) / std::sqrt(double(dh));
    auto future = torch::ones({L, L}, torch::kBool).triu(1);
    auto a = drop(torch::softmax(s.masked_fill(future, -INFINITY), -1));
    return drop(proj(a.matmul(t[2]).transpose(1, 2).reshape({B, L, D})));
  }
  int64_t heads;
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  lockstep::numerics::Dropout drop{nullptr};
};
TORCH_MODULE(Attn);

// Pre-norm feed-forward block; its second dropout is torch's own (drawn again in a
// recomputation from the replayed RNG state, after a kept mask).
struct FfImpl : torch::nn::Module {
  FfImpl(int64_t d, double p) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc1 = register_module("fc1", torch::nn::Linear(d, 2 * d));
    fc2 = register_module("fc2", torch::nn::Linear(2 * d, d));
    drop = register_module("drop", lockstep::numerics::Dropout(p));
    torch_drop = register_module("torch_drop", torch::nn::Dropout(p));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch_drop(fc2(drop(torch::gelu(fc1(ln(x))))));
  }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  lockstep::numerics::Dropout drop{nullptr};
  torch::nn::Dropout torch_drop{nullptr};
};
TORCH_MODULE(Ff);

// One layer running its plan through lockstep::numerics::run_residual_layer.
struct LayerImpl : torch::nn::Module {
  LayerImpl(int64_t d, int64_t heads, double p, LayerCheckpointing plan) : plan(plan) {
    attn = register_module("attn", Attn(d, heads, p));
    ff = register_module("ff", Ff(d, p));
  }
  torch::Tensor forward(const torch::Tensor& h) {
    lockstep::numerics::ResidualLayer layer;
    layer.attention = [a = attn](const torch::Tensor& in, const TensorVec&) mutable {
      return a(in);
    };
    layer.attention_params = attn->parameters();
    layer.mlp = [f = ff](const torch::Tensor& in) mutable { return f(in); };
    layer.mlp_params = ff->parameters();
    return lockstep::numerics::run_residual_layer(plan, layer, h);
  }
  LayerCheckpointing plan;
  Attn attn{nullptr};
  Ff ff{nullptr};
};
TORCH_MODULE(Layer);

constexpr int64_t kLayers = 5;

torch::nn::Sequential make_stack(const CheckpointPolicy& policy, torch::Dtype dtype) {
  torch::manual_seed(0);  // the same weights for every policy
  torch::nn::Sequential net;
  for (int64_t i = 0; i < kLayers; ++i) net->push_back(Layer(16, 2, 0.2, policy.for_layer(i)));
  net->to(dtype);
  return net;
}

// Output, then the gradients of every parameter and of the input, after one backward.
TensorVec run(const CheckpointPolicy& policy, torch::Dtype dtype, bool autocast) {
  auto net = make_stack(policy, dtype);
  auto x = torch::randn({2, 12, 16}, torch::TensorOptions().dtype(dtype)).requires_grad_(true);
  torch::manual_seed(123);  // the dropout masks
  torch::Tensor y;
  {
    c10::optional<lockstep::numerics::Autocast> ac;
    if (autocast) ac.emplace();
    y = net->forward(x);
  }
  y.to(dtype).pow(2).sum().backward();
  TensorVec out{y.detach()};
  for (const auto& p : net->parameters()) out.push_back(p.grad());
  out.push_back(x.grad());
  return out;
}

using lockstep::testing::max_diff;

std::string describe(const CheckpointPolicy& p) {
  return std::string(lockstep::numerics::checkpoint_blocks_name(p.blocks)) + ", every " +
         std::to_string(p.every) + (p.keep_dropout_masks ? ", masks kept" : ", masks redrawn");
}

// Every policy kind, k = 1..3 and both mask modes against the plain stack: tolerance 0.
void expect_all_policies_identical(torch::Dtype dtype, bool autocast, const char* what) {
  const TensorVec plain = run(CheckpointPolicy{}, dtype, autocast);
  for (auto blocks : {CheckpointBlocks::Layer, CheckpointBlocks::Attention, CheckpointBlocks::Mlp})
    for (int64_t every : {1, 2, 3})
      for (bool keep : {true, false}) {
        CheckpointPolicy p;
        p.enabled = true;
        p.blocks = blocks;
        p.every = every;
        p.keep_dropout_masks = keep;
        const double d = max_diff(run(p, dtype, autocast), plain);
        std::printf("%s, %s: max |selective - plain| over output and gradients = %.3g\n", what,
                    describe(p).c_str(), d);
        EXPECT_EQ(d, 0.0) << what << ", " << describe(p);
      }
}

TEST(CheckpointPolicy, EveryPolicyIsBitIdenticalWithDropoutFloat32) {
  expect_all_policies_identical(torch::kFloat, false, "float32");
}

TEST(CheckpointPolicy, EveryPolicyIsBitIdenticalWithDropoutFloat64) {
  expect_all_policies_identical(torch::kDouble, false, "float64");
}

TEST(CheckpointPolicy, EveryPolicyIsBitIdenticalUnderBf16Autocast) {
  expect_all_policies_identical(torch::kFloat, true, "bf16 autocast");
}

TEST(CheckpointPolicy, DropoutIsActiveInTheTestStack) {
  // Another mask seed changes the output: the comparisons above do depend on the masks.
  const TensorVec a = run(CheckpointPolicy{}, torch::kFloat, false);
  auto net = make_stack(CheckpointPolicy{}, torch::kFloat);
  auto x = torch::randn({2, 12, 16});
  torch::manual_seed(124);
  EXPECT_FALSE(torch::equal(net->forward(x), a[0]));
}

TEST(CheckpointPolicy, PlansEveryKthLayerAndTheChosenBlock) {
  CheckpointPolicy p;
  EXPECT_FALSE(p.for_layer(0).any());  // off by default
  p.enabled = true;
  for (int64_t k = 1; k <= 4; ++k) {
    p.every = k;
    for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(p.for_layer(i).layer, i % k == 0) << k << " " << i;
  }
  p.every = 2;
  p.blocks = CheckpointBlocks::Attention;
  EXPECT_TRUE(p.for_layer(2).attention);
  EXPECT_FALSE(p.for_layer(2).layer || p.for_layer(2).mlp || p.for_layer(3).any());
  p.blocks = CheckpointBlocks::Mlp;
  p.keep_dropout_masks = false;
  EXPECT_TRUE(p.for_layer(4).mlp);
  EXPECT_FALSE(p.for_layer(4).keep_dropout_masks);
  p.every = 0;
  EXPECT_THROW(p.for_layer(0), lockstep::InvalidArgument);
}

TEST(CheckpointPolicy, BlockNamesRoundTripAndABadOneIsAnError) {
  for (auto b : {CheckpointBlocks::Layer, CheckpointBlocks::Attention, CheckpointBlocks::Mlp})
    EXPECT_EQ(
        lockstep::numerics::parse_checkpoint_blocks(lockstep::numerics::checkpoint_blocks_name(b)),
        b);
  try {
    lockstep::numerics::parse_checkpoint_blocks("attn");
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const lockstep::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'attn'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layer, attention, mlp"), std::string::npos) << msg;
  }
}

TEST(CheckpointDropout, OutsideACheckpointItIsTorchDropout) {
  auto x = torch::randn({6, 10}).t();  // non-contiguous: the mask's layout matters
  const auto gen = at::detail::getDefaultCPUGenerator();
  torch::manual_seed(5);
  auto ours = lockstep::numerics::dropout(x, 0.3, true);
  const torch::Tensor after_ours = gen.get_state();
  torch::manual_seed(5);
  auto theirs = torch::dropout(x, 0.3, true);
  EXPECT_TRUE(torch::equal(ours, theirs));
  EXPECT_TRUE(torch::equal(gen.get_state(), after_ours));  // the same numbers consumed
  EXPECT_TRUE(torch::equal(lockstep::numerics::dropout(x, 0.3, false), x));
  EXPECT_THROW(lockstep::numerics::Dropout(1.5), lockstep::InvalidArgument);
}

TEST(CheckpointDropout, InsideACheckpointNonContiguousInputIsBitIdentical) {
  auto w = torch::randn({10, 10}).requires_grad_(true);
  auto x = torch::randn({6, 10}).requires_grad_(true);
  auto fn = [&](const torch::Tensor& in) {
    return lockstep::numerics::dropout(in.matmul(w).t(), 0.4, true).sin();  // a transposed view
  };
  torch::manual_seed(6);
  auto plain = fn(x);
  plain.sum().backward();
  const TensorVec g_plain{w.grad().clone(), x.grad().clone()};
  w.mutable_grad() = torch::Tensor();
  x.mutable_grad() = torch::Tensor();
  torch::manual_seed(6);
  auto ck = lockstep::numerics::activation_checkpoint(fn, x, {w});
  ck.sum().backward();
  const double d =
      max_diff({ck.detach(), w.grad(), x.grad()}, {plain.detach(), g_plain[0], g_plain[1]});
  std::printf("transposed input: max |checkpointed - plain| = %.3g\n", d);
  EXPECT_EQ(d, 0.0);
}

TEST(CheckpointDropout, NestedCheckpointsWithKeptMasksAreBitIdentical) {
  torch::manual_seed(7);
  auto net = make_stack(CheckpointPolicy{}, torch::kFloat);  // plain layers
  auto x = torch::randn({2, 12, 16}).requires_grad_(true);
  auto two = [&](const torch::Tensor& in) {
    auto h = lockstep::numerics::activation_checkpoint(
        [&](const torch::Tensor& t) { return (*net)[0]->as<Layer>()->forward(t); }, in,
        (*net)[0]->parameters());
    return (*net)[1]->as<Layer>()->forward(lockstep::numerics::dropout(h, 0.3, true));
  };
  auto grads = [&](bool ckpt) {
    net->zero_grad();
    x.mutable_grad() = torch::Tensor();
    torch::manual_seed(8);
    auto y = ckpt ? lockstep::numerics::activation_checkpoint(two, x, net->parameters()) : two(x);
    y.pow(2).sum().backward();
    TensorVec g{y.detach(), x.grad().clone()};
    for (const auto& p : net->parameters())
      if (p.grad().defined()) g.push_back(p.grad().clone());
    return g;
  };
  const TensorVec plain = grads(false);
  const double d = max_diff(grads(true), plain);
  std::printf("nested checkpoints, kept masks: max |checkpointed - plain| = %.3g\n", d);
  EXPECT_EQ(d, 0.0);
}

TEST(CheckpointDropout, ARecomputationWithOtherDropoutCallsIsAnError) {
  auto w = torch::randn({4, 4}).requires_grad_(true);
  int calls = 0;
  auto fn = [&](const torch::Tensor& in) {  // not deterministic: another shape the second time
    auto h = in.matmul(w);
    return lockstep::numerics::dropout(++calls == 1 ? h : h.narrow(0, 0, 1), 0.5, true).sum(0);
  };
  auto y = lockstep::numerics::activation_checkpoint(fn, torch::randn({3, 4}), {w});
  try {
    y.sum().backward();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const lockstep::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("same dropout calls"), std::string::npos) << msg;
  }
}

}  // namespace
