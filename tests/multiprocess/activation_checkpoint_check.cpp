// Activation checkpointing under DDP and FSDP: a model whose blocks are checkpointed
// (lockstep::numerics::checkpoint_wrapper, dropout inside) trains to the same parameters as the
// same model without checkpointing, on every rank, for SGD with momentum and Adam in float64 and
// float32 (expected bit-identical: tolerance 0, max difference printed). The two variants run side
// by side in this process from the same seeds, so dropout draws the same masks in both. Under FSDP
// the checkpoint sits inside each unit (wrap_children over the Sequential of checkpointed blocks);
// a checkpoint AROUND an FSDP unit is an error in backward, checked last. Runs standalone under
// lockstep-run / mpirun.
#include <lockstep/lockstep.h>
#include <lockstep/numerics/activation_checkpoint.h>
#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/parallel/fsdp/fsdp.h>

#include <torch/torch.h>

#include "tally.h"

#include <cmath>
#include <memory>
#include <string>

namespace fsdp = lockstep::fsdp;

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(12, 24));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(24, 12));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(drop(torch::tanh(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

// inp -> three checkpointable blocks -> out. `ckpt` switches the wrappers on or off;
// `fsdp_units` makes each block an FSDP unit (the checkpoint inside it).
struct Net : torch::nn::Module {
  Net(bool ckpt, bool fsdp_units) {
    inp = register_module("inp", torch::nn::Linear(6, 12));
    torch::nn::Sequential seq;
    for (int i = 0; i < 3; ++i) {
      auto c = lockstep::numerics::checkpoint_wrapper(Block());
      c->set_enabled(ckpt);
      seq->push_back(c);
    }
    blocks = register_module("blocks", fsdp_units ? fsdp::wrap_children(seq) : seq);
    out = register_module("out", torch::nn::Linear(12, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return out(blocks->forward(torch::relu(inp(x))));
  }
  torch::nn::Linear inp{nullptr}, out{nullptr};
  torch::nn::Sequential blocks{nullptr};
};

struct Case {
  std::string name;
  at::ScalarType dtype = at::kDouble;
  bool adam = false;
  // DDP's bucket rebuild follows the order in which gradients became ready, which
  // checkpointing changes (a block's gradients arrive together, in declaration order). The
  // reduced values are the same, but with 3+ ranks gloo's ring sums a bucket in chunks
  // whose boundaries follow the layout: a different summation order, so rounding-level
  // differences (tolerance below). Without the rebuild the layouts match: bit-identical.
  bool rebuild = false;
  double tol = 0;
};

std::unique_ptr<torch::optim::Optimizer> make_opt(const Case& c, std::vector<torch::Tensor> ps) {
  if (c.adam)
    return std::make_unique<torch::optim::Adam>(std::move(ps), torch::optim::AdamOptions(1e-2));
  return std::make_unique<torch::optim::SGD>(std::move(ps),
                                             torch::optim::SGDOptions(0.1).momentum(0.9));
}

double max_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return INFINITY;
  double d = 0;
  for (const auto& item : pa) {
    const auto* other = pb.find(item.key());
    if (other == nullptr) return INFINITY;
    d = std::max(
        d, (item.value().to(at::kDouble) - other->to(at::kDouble)).abs().max().item<double>());
  }
  return d;
}

constexpr int kSteps = 5;
constexpr int64_t kBatch = 4;

// This rank's batch of step s (the ranks' batches differ; so do their dropout masks).
std::pair<torch::Tensor, torch::Tensor> batch(int s, int rank, at::ScalarType dtype) {
  torch::manual_seed(77 + 31 * s + 1000 * rank);
  auto x = torch::randn({kBatch, 6}, dtype);
  return {x, torch::randn({kBatch, 3}, dtype)};
}

// Rank-dependent initial weights (the wrappers' construction fixes them), the same for both
// variants.
std::shared_ptr<Net> make_net(int rank, bool ckpt, bool fsdp_units, at::ScalarType dtype) {
  torch::manual_seed(500 + rank);
  auto net = std::make_shared<Net>(ckpt, fsdp_units);
  net->to(dtype);
  return net;
}

void ddp_case(const std::shared_ptr<lockstep::ProcessGroup>& pg, const Case& c) {
  const int r = pg->rank();
  auto plain = make_net(r, false, false, c.dtype), ckpt = make_net(r, true, false, c.dtype);
  lockstep::ddp::DDPOptions o;
  o.rebuild_buckets = c.rebuild;
  lockstep::DistributedDataParallel ddp_plain(plain, pg, o), ddp_ckpt(ckpt, pg, o);
  auto opt_plain = make_opt(c, ddp_plain.parameters()),
       opt_ckpt = make_opt(c, ddp_ckpt.parameters());
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, r, c.dtype);
    torch::manual_seed(9 + s);
    torch::mse_loss(ddp_plain(x), y).backward();
    torch::manual_seed(9 + s);
    torch::mse_loss(ddp_ckpt(x), y).backward();
    opt_plain->step();
    opt_ckpt->step();
    opt_plain->zero_grad();
    opt_ckpt->zero_grad();
  }
  tally::report(std::string("ddp ") + (c.rebuild ? "rebuilt buckets " : "") + c.name +
                    " P=" + std::to_string(pg->size()),
                max_diff(*ckpt, *plain), c.tol);
}

void fsdp_case(const std::shared_ptr<lockstep::ProcessGroup>& pg, const Case& c,
               fsdp::ShardingStrategy strategy) {
  const int r = pg->rank();
  auto plain = make_net(r, false, true, c.dtype), ckpt = make_net(r, true, true, c.dtype);
  fsdp::FSDPOptions o;
  o.strategy = strategy;
  lockstep::FullyShardedDataParallel f_plain(plain, pg, o), f_ckpt(ckpt, pg, o);
  auto opt_plain = make_opt(c, f_plain.parameters()), opt_ckpt = make_opt(c, f_ckpt.parameters());
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s, r, c.dtype);
    torch::manual_seed(9 + s);
    torch::mse_loss(f_plain(x), y).backward();
    torch::manual_seed(9 + s);
    torch::mse_loss(f_ckpt(x), y).backward();
    opt_plain->step();
    opt_ckpt->step();
    opt_plain->zero_grad();
    opt_ckpt->zero_grad();
  }
  f_plain.summon_full_params();
  f_ckpt.summon_full_params();
  tally::report(std::string("fsdp ") + fsdp::strategy_name(strategy) + " " + c.name +
                    " P=" + std::to_string(pg->size()),
                max_diff(*ckpt, *plain), 0);
  f_ckpt.release_full_params();
  f_plain.release_full_params();
}

// A checkpoint around a whole FSDP unit: its recomputation calls the unit again outside
// FSDP's forward, which FSDP refuses; the error must come out of backward, not wrong
// gradients.
void checkpoint_around_unit_is_an_error(const std::shared_ptr<lockstep::ProcessGroup>& pg) {
  struct Outer : torch::nn::Module {
    Outer() { unit = register_module("unit", fsdp::wrap(Block())); }
    torch::Tensor forward(const torch::Tensor& x) {
      return lockstep::numerics::activation_checkpoint(
          [this](const torch::Tensor& in) { return unit(in); }, x, parameters());
    }
    fsdp::Wrapped<BlockImpl> unit{nullptr};
  };
  auto net = std::make_shared<Outer>();
  net->to(at::kDouble);
  lockstep::FullyShardedDataParallel f(net, pg);
  std::string what;
  try {
    f(torch::randn({2, 12}, at::kDouble).requires_grad_(true)).sum().backward();
  } catch (const lockstep::Error& e) {
    what = e.what();
  }
  tally::check("checkpoint around an FSDP unit: error in backward", !what.empty(), what);
}

}  // namespace

int main() {
  auto pg = lockstep::init();
  tally::rank = pg->rank();
  tally::subject = "checkpointed";
  const Case cases[] = {{"sgd f64", at::kDouble, false},
                        {"sgd f32", at::kFloat, false},
                        {"adam f64", at::kDouble, true},
                        {"adam f32", at::kFloat, true}};
  for (const auto& c : cases) ddp_case(pg, c);
  ddp_case(pg, {"adam f64", at::kDouble, true, true, 1e-12});
  ddp_case(pg, {"adam f32", at::kFloat, true, true, 1e-5});
  using S = fsdp::ShardingStrategy;
  for (const auto& c : cases) fsdp_case(pg, c, S::FullShard);
  fsdp_case(pg, cases[3], S::ShardGradOp);
  fsdp_case(pg, cases[2], S::NoShard);
  checkpoint_around_unit_is_an_error(pg);
  return tally::finish();
}
