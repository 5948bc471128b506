// CTSM with selective activation checkpointing (CtsmOptions::checkpoint, the trainer's
// [memory] keys): every policy gives the plain model's loss and gradients bit for bit,
// with dropout, in float32 and float64 (the attention's second stream, the outcome
// embedding, goes through the checkpoints as an input, so its embeddings get gradients).
#include <ctsm/model.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

using namespace ctsm;

namespace {

ClientHistory history() {
  ClientHistory c;
  auto ev = [](int64_t day, uint32_t item, EventType t, uint8_t fb = 0) {
    return Event{day * 86400, item, t, fb, 0.5f};
  };
  using T = EventType;
  c.events = {ev(1, 3, T::Keep),        ev(1, 4, T::Return),  ev(1, 5, T::Keep),
              ev(4, 0, T::Feedback, 4), ev(20, 6, T::Return), ev(20, 7, T::Keep),
              ev(40, 8, T::Keep),       ev(40, 9, T::Return), ev(41, 10, T::Keep)};
  return c;
}

// Loss, then every parameter's gradient, after one training step's backward.
std::vector<torch::Tensor> run(const lockstep::numerics::CheckpointPolicy& policy,
                               torch::Dtype dtype) {
  torch::manual_seed(0);
  CtsmOptions o;
  o.num_items = 20;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 3;
  o.d_ff = 32;
  o.dropout = 0.2;
  o.checkpoint = policy;
  Ctsm m(o);
  m->to(dtype);
  m->train();
  auto b = collate({make_train_example(history(), int64_t{1000} * 86400, 64)});
  torch::manual_seed(7);  // the dropout masks
  auto loss = CtsmImpl::loss(m->forward(b), b);
  loss.backward();
  std::vector<torch::Tensor> out{loss.detach()};
  for (const auto& p : m->parameters()) out.push_back(p.grad());
  return out;
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return INFINITY;
    if (a[i].defined())
      d = std::max(d,
                   (a[i].to(torch::kDouble) - b[i].to(torch::kDouble)).abs().max().item<double>());
  }
  return d;
}

TEST(CtsmCheckpoint, EveryPolicyGivesThePlainGradients) {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    const auto plain = run(lockstep::numerics::CheckpointPolicy{}, dtype);
    for (auto blocks : {lockstep::numerics::CheckpointBlocks::Layer,
                        lockstep::numerics::CheckpointBlocks::Attention,
                        lockstep::numerics::CheckpointBlocks::Mlp})
      for (int64_t every : {1, 2})
        for (bool keep : {true, false}) {
          lockstep::numerics::CheckpointPolicy p;
          p.enabled = true;
          p.blocks = blocks;
          p.every = every;
          p.keep_dropout_masks = keep;
          const double d = max_diff(run(p, dtype), plain);
          std::printf("%s, %s every %lld, masks %s: max |checkpointed - plain| = %.3g\n",
                      dtype == torch::kFloat ? "float32" : "float64",
                      lockstep::numerics::checkpoint_blocks_name(blocks),
                      static_cast<long long>(every), keep ? "kept" : "redrawn", d);
          EXPECT_EQ(d, 0.0);
        }
  }
}

}  // namespace
