// consumer: what a user's own program does with an installed lockstep. Run on N ranks
// with lockstep-run; checks an allreduce and one DDP step against values it knows, prints
// "consumer: rank R of N ok" and exits 0, or names the mismatch and exits 1.
#include <lockstep/lockstep.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

namespace {

// Sum over ranks of (rank + 1) in every element: N(N+1)/2.
bool check_allreduce(lockstep::ProcessGroup& group) {
  at::Tensor t = torch::full({8}, static_cast<double>(group.rank() + 1), torch::kFloat64);
  group.allreduce(t)->wait();
  const double n = group.size();
  const double want = n * (n + 1) / 2;
  const double err = (t - want).abs().max().item<double>();
  if (err != 0) std::fprintf(stderr, "allreduce: max |got - %g| = %g\n", want, err);
  return err == 0;
}

// One DDP step of a linear model y = w.x with per-rank data x = (rank+1) * ones: the
// averaged gradient of the sum of the outputs is mean over ranks of (rank+1) = (N+1)/2
// in every weight, identical on every rank.
bool check_ddp_step(const std::shared_ptr<lockstep::ProcessGroup>& group) {
  torch::manual_seed(group->rank());  // different initial weights: DDP broadcasts rank 0's
  torch::nn::Linear model(torch::nn::LinearOptions(4, 1).bias(false));
  lockstep::DistributedDataParallel ddp(model, group);
  at::Tensor x = torch::full({1, 4}, static_cast<float>(group->rank() + 1));
  ddp(x).sum().backward();
  const double want = (group->size() + 1) / 2.0;
  const double err = (model->weight.grad() - want).abs().max().item<double>();
  const double tol = 1e-6;  // float32 average of small integers: exact in practice
  std::printf("consumer: rank %d DDP gradient max |diff| %.3g (tolerance %g)\n", group->rank(), err,
              tol);
  return err <= tol;
}

}  // namespace

int main() {
  try {
    auto group = lockstep::init();
    const bool ok = check_allreduce(*group) && check_ddp_step(group);
    std::printf("consumer: rank %d of %d %s\n", group->rank(), group->size(), ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
