// The distributed gradient scaler under DDP and FSDP: an inf injected into one rank's
// gradients only (after DDP's allreduce, or into one FSDP shard) makes EVERY rank skip that
// step and back off the scale by the same factor, naming that rank; the other steps train
// as a single process on the full batch does (with the same step skipped), within a stated
// tolerance, in float32 and float64. Runs under lockstep-run / mpirun; prints "N passed, M
// failed".
#include <lockstep/lockstep.h>
#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/parallel/fsdp/fsdp.h>

#include <torch/torch.h>

#include "tally.h"

#include <limits>
#include <string>
#include <vector>

namespace numerics = lockstep::numerics;

namespace {

using tally::check;

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out) {
    a = register_module("a", torch::nn::Linear(in, 16));
    b = register_module("b", torch::nn::Linear(16, out));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::tanh(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    b1 = register_module("b1", lockstep::fsdp::wrap(Block(6, 8)));
    b2 = register_module("b2", lockstep::fsdp::wrap(Block(8, 3)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b2(torch::relu(b1(x))); }
  lockstep::fsdp::Wrapped<BlockImpl> b1{nullptr}, b2{nullptr};
};
TORCH_MODULE(Net);

constexpr int kSteps = 6;
constexpr int kBadStep = 2;  // the step whose gradients hold an inf on the last rank
constexpr int64_t kBatch = 4;

torch::optim::AdamW make_opt(std::vector<torch::Tensor> ps) {
  return torch::optim::AdamW(std::move(ps), torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
}

void batch(int step, int P, torch::Dtype dt, torch::Tensor& x, torch::Tensor& y) {
  torch::manual_seed(100 + step);
  x = torch::randn({P * kBatch, 6}, dt);
  y = torch::randn({P * kBatch, 3}, dt);
}

// One process on the full batch, step kBadStep skipped: what every rank must end with.
std::vector<torch::Tensor> reference(int P, torch::Dtype dt) {
  torch::manual_seed(5);
  Net net;
  net->to(dt);
  auto opt = make_opt(net->parameters());
  for (int s = 0; s < kSteps; ++s) {
    if (s == kBadStep) continue;
    torch::Tensor x, y;
    batch(s, P, dt, x, y);
    opt.zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    opt.step();
  }
  return net->parameters();
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d = std::max(d, (a[i].to(at::kDouble) - b[i].to(at::kDouble)).abs().max().item<double>());
  return a.size() == b.size() ? d : std::numeric_limits<double>::infinity();
}

// Trains kSteps with a scaler; `forward` runs the wrapped model, `opt_params` are what the
// optimizer updates (all parameters under DDP, the local shards under FSDP).
template <class Forward>
void train_and_check(const std::shared_ptr<lockstep::ProcessGroup>& pg, const std::string& tag,
                     torch::Dtype dt, Forward forward, std::vector<torch::Tensor> opt_params) {
  const int P = pg->size(), r = pg->rank();
  auto opt = make_opt(opt_params);
  numerics::GradScaler scaler({}, pg);
  for (int s = 0; s < kSteps; ++s) {
    torch::Tensor x, y;
    batch(s, P, dt, x, y);
    opt.zero_grad();
    scaler
        .scale(torch::mse_loss(forward(x.narrow(0, r * kBatch, kBatch)),
                               y.narrow(0, r * kBatch, kBatch)))
        .backward();
    if (s == kBadStep && r == P - 1) {
      torch::NoGradGuard ng;
      for (auto& p : opt_params)
        if (p.grad().defined() && p.grad().numel() > 0) {
          p.grad().view(-1)[0] = std::numeric_limits<double>::infinity();
          break;
        }
    }
    const bool stepped = scaler.step(opt);
    if (s == kBadStep) {
      check(tag + " the step with an inf on rank " + std::to_string(P - 1) + " is skipped",
            !stepped && scaler.skipped_ranks() == std::vector<int>{P - 1});
    } else if (!stepped) {
      check(tag + " step " + std::to_string(s) + " stepped", false);
    }
    scaler.update();
  }
  // 2^16 halved once; growth (every 2000 good steps) never happens here.
  tally::report(tag + " scale after one backoff", std::abs(scaler.get_scale() - 32768.0), 0);
}

void run(const std::shared_ptr<lockstep::ProcessGroup>& pg, torch::Dtype dt, double tol) {
  const std::string dts = dt == torch::kDouble ? "f64" : "f32";
  const auto ref = reference(pg->size(), dt);
  {
    torch::manual_seed(5);
    Net net;
    net->to(dt);
    lockstep::DistributedDataParallel ddp(net.ptr(), pg);
    const std::string tag = "ddp " + dts;
    train_and_check(
        pg, tag, dt, [&](const torch::Tensor& x) { return ddp(x); }, ddp.parameters());
    tally::report(tag + " params", max_diff(net->parameters(), ref), tol);
  }
  {
    torch::manual_seed(5);
    Net net;
    net->to(dt);
    lockstep::FullyShardedDataParallel fsdp(net.ptr(), pg);
    const std::string tag = "fsdp " + dts;
    train_and_check(
        pg, tag, dt, [&](const torch::Tensor& x) { return fsdp(x); }, fsdp.parameters());
    lockstep::fsdp::FSDPCore::FullParamsGuard full(fsdp.core());  // collective
    tally::report(tag + " params", max_diff(net->parameters(), ref), tol);
  }
}

}  // namespace

int main() {
  auto pg = lockstep::init();
  tally::rank = pg->rank();
  tally::subject = "scaled";
  run(pg, torch::kDouble, 1e-12);
  run(pg, torch::kFloat, 1e-5);
  return tally::finish();
}
