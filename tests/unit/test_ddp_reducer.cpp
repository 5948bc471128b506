// DDP on a world of 1 (lockstep::init() with no launcher environment): hooks,
// rebuild, no_sync, unused parameters, comm hooks, error propagation, stats.
#include <lockstep/lockstep.h>
#include <lockstep/parallel/ddp/ddp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    extra = register_parameter("extra", torch::ones({3}));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_extra = true) {
    auto y = fc2(torch::relu(fc1(x)));
    if (use_extra) y = y + extra.sum();
    return y;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor extra;
};

std::shared_ptr<lockstep::ProcessGroup> world() {
  static auto g = lockstep::init();
  return g;
}

std::map<std::string, torch::Tensor> grads_of(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : m.named_parameters())
    out[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::Tensor();
  return out;
}

// Reference gradients computed without DDP on a copy with the same weights.
std::map<std::string, torch::Tensor> reference_grads(const std::shared_ptr<Mlp>& src,
                                                     const std::vector<torch::Tensor>& xs,
                                                     bool use_extra = true) {
  auto ref = std::make_shared<Mlp>();
  {
    torch::NoGradGuard g;
    auto a = ref->parameters(), b = src->parameters();
    for (size_t i = 0; i < a.size(); ++i) a[i].copy_(b[i]);
  }
  for (auto& x : xs) ref->forward(x, use_extra).square().mean().backward();
  return grads_of(*ref);
}

void expect_close(const std::map<std::string, torch::Tensor>& a,
                  const std::map<std::string, torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (auto& [k, v] : a) {
    const auto& w = b.at(k);
    ASSERT_EQ(v.defined(), w.defined()) << k;
    if (v.defined()) {
      EXPECT_TRUE(torch::allclose(v, w, 1e-6, 1e-7)) << k;
    }
  }
}

TEST(DdpWorld1, GradientsMatchPlainBackward) {
  torch::manual_seed(0);
  auto model = std::make_shared<Mlp>();
  lockstep::DistributedDataParallel ddp(model, world());
  static_assert(std::is_same_v<decltype(ddp), lockstep::DistributedDataParallel<Mlp>>);
  auto x = torch::randn({5, 8});
  ddp(x).square().mean().backward();
  expect_close(grads_of(*model), reference_grads(model, {x}));
  const auto& s = ddp.last_step_stats();
  EXPECT_EQ(s.step, 1);
  EXPECT_GE(s.buckets, 1);
  EXPECT_EQ(s.bytes_sent, (8 * 16 + 16 + 16 * 4 + 4 + 3) * 4);
  EXPECT_GE(s.backward_s, 0);
  EXPECT_GE(s.exposed_comm_s, 0);
  EXPECT_EQ(ddp.parameters().size(), 5u);
  EXPECT_EQ(ddp.named_parameters().size(), 5u);
}

TEST(DdpWorld1, ModuleHolderDeduction) {
  torch::nn::Linear lin(4, 2);
  lockstep::DistributedDataParallel ddp(lin, world());
  static_assert(
      std::is_same_v<decltype(ddp), lockstep::DistributedDataParallel<torch::nn::LinearImpl>>);
  auto y = ddp(torch::randn({3, 4}));
  y.sum().backward();
  EXPECT_TRUE(lin->weight.grad().defined());
  EXPECT_TRUE(torch::allclose(lin->bias.grad(), torch::full({2}, 3.0)));
}

TEST(DdpWorld1, BucketsRebuiltOnceFromObservedOrder) {
  torch::manual_seed(1);
  auto model = std::make_shared<Mlp>();
  lockstep::DDPOptions o;
  o.first_bucket_bytes = 1;  // one parameter per bucket: the order is visible
  o.bucket_cap_bytes = 1;
  lockstep::DistributedDataParallel ddp(model, world(), o);
  auto& r = ddp.reducer();
  ASSERT_EQ(r.num_buckets(), 5);
  // Initially reverse registration order (named_parameters lists a module's own
  // parameters before its children's): fc2.bias, fc2.weight, fc1.bias, fc1.weight, extra.
  EXPECT_EQ(r.buckets()[0].names, std::vector<std::string>{"fc2.bias"});
  EXPECT_EQ(r.buckets()[4].names, std::vector<std::string>{"extra"});
  EXPECT_FALSE(r.buckets_rebuilt());
  auto x = torch::randn({2, 8});
  ddp(x).square().mean().backward();
  EXPECT_EQ(r.observed_order().size(), 5u);
  ddp(x).square().mean().backward();  // the forward rebuilt
  EXPECT_TRUE(r.buckets_rebuilt());
  for (int64_t b = 0; b < r.num_buckets(); ++b) {
    ASSERT_EQ(r.buckets()[b].param_indices.size(), 1u);
    EXPECT_EQ(r.buckets()[b].param_indices[0], r.observed_order()[b]);
    EXPECT_EQ(r.buckets()[b].index, b);
  }
  EXPECT_TRUE(r.buckets().back().is_last);
  // Gradients are still right after the rebuild (two backwards accumulated).
  auto ref = reference_grads(model, {x, x});
  expect_close(grads_of(*model), ref);
}

TEST(DdpWorld1, NoSyncAccumulatesThenReduces) {
  torch::manual_seed(2);
  auto model = std::make_shared<Mlp>();
  lockstep::DistributedDataParallel ddp(model, world());
  auto a = torch::randn({4, 8}), b = torch::randn({4, 8}), c = torch::randn({4, 8});
  {
    auto guard = ddp.no_sync();
    EXPECT_FALSE(ddp.reducer().require_sync());
    ddp(a).square().mean().backward();
    ddp(b).square().mean().backward();
  }
  EXPECT_TRUE(ddp.reducer().require_sync());
  EXPECT_EQ(ddp.last_step_stats().step, 0);  // nothing communicated yet
  ddp(c).square().mean().backward();
  EXPECT_EQ(ddp.last_step_stats().step, 1);
  expect_close(grads_of(*model), reference_grads(model, {a, b, c}));
}

TEST(DdpWorld1, UnusedParameterWithoutOptionRaisesNamingIt) {
  auto model = std::make_shared<Mlp>();
  lockstep::DistributedDataParallel ddp(model, world());
  try {
    ddp(torch::randn({2, 8}), /*use_extra=*/false).sum().backward();
    FAIL() << "expected an error";
  } catch (const lockstep::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'extra'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos);
  }
  // In a world of 1 nobody can drift, so the group stays usable and the reducer recovered
  // (with peers, the error breaks the group: see docs/ddp.md).
  model->zero_grad();
  ddp(torch::randn({2, 8})).sum().backward();
  EXPECT_TRUE(model->extra.grad().defined());
}

TEST(DdpWorld1, FindUnusedKeepsUnusedGradUndefined) {
  torch::manual_seed(3);
  auto model = std::make_shared<Mlp>();
  lockstep::DDPOptions o;
  o.find_unused_parameters = true;
  lockstep::DistributedDataParallel ddp(model, world(), o);
  auto x = torch::randn({3, 8});
  ddp(x, false).square().mean().backward();
  EXPECT_FALSE(model->extra.grad().defined());
  EXPECT_EQ(ddp.last_step_stats().unused_parameters, 1);
  expect_close(grads_of(*model), reference_grads(model, {x}, false));
  ddp(x, true).square().mean().backward();  // used again later
  EXPECT_TRUE(model->extra.grad().defined());
}

TEST(DdpWorld1, GradientAsBucketView) {
  torch::manual_seed(4);
  auto model = std::make_shared<Mlp>();
  lockstep::DDPOptions o;
  o.gradient_as_bucket_view = true;
  lockstep::DistributedDataParallel ddp(model, world(), o);
  auto x = torch::randn({3, 8});
  for (int it = 0; it < 3; ++it) {  // crosses the rebuild
    model->zero_grad();
    ddp(x).square().mean().backward();
  }
  expect_close(grads_of(*model), reference_grads(model, {x}));
  // Each grad aliases its bucket.
  auto& r = ddp.reducer();
  for (auto& b : r.buckets())
    for (size_t k = 0; k < b.param_indices.size(); ++k)
      EXPECT_EQ(r.parameters()[b.param_indices[k]].grad().data_ptr(),
                static_cast<void*>(static_cast<char*>(b.buffer.data_ptr()) +
                                   b.offsets[k] * b.buffer.element_size()));
}

TEST(DdpWorld1, CompressionHooksKeepAverage) {
  for (const auto& hook :
       {lockstep::ddp::hooks::bf16_compress_hook(), lockstep::ddp::hooks::fp16_compress_hook()}) {
    torch::manual_seed(5);
    auto model = std::make_shared<Mlp>();
    lockstep::DistributedDataParallel ddp(model, world());
    ddp.register_comm_hook(hook);
    auto x = torch::randn({3, 8});
    ddp(x).square().mean().backward();
    auto ref = reference_grads(model, {x});
    for (auto& [k, g] : grads_of(*model)) EXPECT_TRUE(torch::allclose(g, ref[k], 1e-2, 1e-3)) << k;
    EXPECT_EQ(ddp.last_step_stats().bytes_sent, (8 * 16 + 16 + 16 * 4 + 4 + 3) * 2);
  }
}

TEST(DdpWorld1, HookSeesNamesAndLayout) {
  auto model = std::make_shared<Mlp>();
  lockstep::DistributedDataParallel ddp(model, world());
  std::vector<std::string> seen;
  ddp.register_comm_hook([&](lockstep::ProcessGroup& g, const lockstep::ddp::GradBucket& b) {
    for (auto& n : b.names) seen.push_back(n);
    EXPECT_EQ(b.offsets.size(), b.names.size());
    int64_t total = 0;
    for (auto n : b.numels) total += n;
    EXPECT_EQ(total, b.buffer.numel());
    return lockstep::ddp::hooks::allreduce_hook()(g, b);
  });
  ddp(torch::randn({2, 8})).sum().backward();
  EXPECT_EQ(seen, (std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight",
                                            "extra"}));
}

TEST(DdpWorld1, FailedCollectivePropagatesOutOfBackward) {
  auto model = std::make_shared<Mlp>();
  lockstep::DistributedDataParallel ddp(model, world());
  ddp.register_comm_hook([](lockstep::ProcessGroup&, const lockstep::ddp::GradBucket& b) {
    lockstep::comm::OpDesc d;
    d.kind = lockstep::comm::OpKind::Allreduce;
    lockstep::CommContext ctx;
    ctx.op = "allreduce";
    auto w = std::make_shared<lockstep::comm::Work>(d, lockstep::comm::Millis(1000), ctx);
    w->finish(std::make_exception_ptr(
        lockstep::CommError(lockstep::CommError::Kind::PeerGone, ctx, "injected failure")));
    return lockstep::ddp::HookResult{w, nullptr, 0};
  });
  EXPECT_THROW(ddp(torch::randn({2, 8})).sum().backward(), lockstep::CommError);
  // State is consistent afterwards: the default hook works again.
  ddp.register_comm_hook(lockstep::ddp::hooks::allreduce_hook());
  model->zero_grad();
  ddp(torch::randn({2, 8})).sum().backward();
  EXPECT_EQ(ddp.last_step_stats().step, 1);
}

}  // namespace
