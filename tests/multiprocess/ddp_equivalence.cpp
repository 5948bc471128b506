// DDP equivalence: P ranks with batch B each, after k steps, hold the same
// parameters as one process trained on the concatenated batch of P*B (computed
// here, on every rank, from the same seeds), within a stated tolerance; the max
// difference is printed. Cases: MLP (SGD, AdamW; float64 and float32; several
// buckets with rebuild and gradient_as_bucket_view; shared and private buckets;
// fp16 hook), convnet with
// batch-norm, a model with parameters unused in some steps/ranks
// (find_unused_parameters), and gradient accumulation with no_sync.
//   --mismatch: rank r>0 builds a different model; every rank must raise
//               ModelMismatch naming the parameter.
// Runs standalone under lockstep-run / mpirun; prints "N passed, M failed".
#include <lockstep/lockstep.h>
#include <lockstep/parallel/ddp/ddp.h>

#include <lockstep/launch/cli.h>
#include <torch/torch.h>

#include "tally.h"

#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>

namespace {

using tally::report;

// --- models: forward(x, variant); variant selects branches (Branchy only) ----

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 32));
    fc3 = register_module("fc3", torch::nn::Linear(32, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, int64_t) {
    return fc3(torch::tanh(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct ConvBn : torch::nn::Module {
  ConvBn() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
    fc = register_module("fc", torch::nn::Linear(4 * 4 * 4, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, int64_t) {
    auto h = torch::max_pool2d(torch::relu(bn(conv(x.view({-1, 2, 8, 8})))), 2);
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};

struct Branchy : torch::nn::Module {
  Branchy() {
    trunk = register_module("trunk", torch::nn::Linear(6, 16));
    head_a = register_module("head_a", torch::nn::Linear(16, 3));
    head_b = register_module("head_b", torch::nn::Linear(16, 3));
    late = register_module("late", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, int64_t v) {
    auto h = torch::relu(trunk(x));
    auto out = head_a(h);
    if (v & 1) out = out + head_b(h);
    if (v & 2) out = out + late(h);
    return out;
  }
  torch::nn::Linear trunk{nullptr}, head_a{nullptr}, head_b{nullptr}, late{nullptr};
};

// --- one case ----------------------------------------------------------------

struct Case {
  std::string name;
  at::ScalarType dtype = at::kDouble;
  bool adamw = false;
  int steps = 4;
  int accum = 1;                     // micro-batches per step (all but the last under no_sync)
  int64_t batch = 4;                 // per rank, per micro-batch
  bool per_chunk_reference = false;  // reference sums per-rank chunk losses (BN, branches)
  double tol = 1e-10;
  lockstep::DDPOptions options;
  lockstep::ddp::CommHook hook;
  std::function<int64_t(int step, int rank)> variant = [](int, int) { return 0; };
  // Odd ranks start with non-contiguous (column-major) zero grads on 2-D parameters, so
  // their buckets take the reducer's copy path while even ranks reduce in place.
  bool strided_grads_on_odd_ranks = false;
};

// AdamW divides by sqrt(v)+eps: gradient components near zero turn rounding-level
// differences (summation order: allreduce vs one big batch) into update
// differences up to lr/eps times larger, compounding over steps. So AdamW cases
// get a looser (still ~1e-6 of one step of lr 1e-2) float64 tolerance than SGD.
double tol_for(const Case& c) { return c.adamw && c.tol < 1e-8 ? 1e-8 : c.tol; }

std::unique_ptr<torch::optim::Optimizer> make_opt(const Case& c, std::vector<torch::Tensor> ps) {
  if (c.adamw)
    return std::make_unique<torch::optim::AdamW>(
        std::move(ps), torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
  return std::make_unique<torch::optim::SGD>(std::move(ps),
                                             torch::optim::SGDOptions(0.1).momentum(0.9));
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  if (a.size() != b.size()) return INFINITY;
  for (size_t i = 0; i < a.size(); ++i)
    d = std::max(d, (a[i].to(at::kDouble) - b[i].to(at::kDouble)).abs().max().item<double>());
  return d;
}

template <class Net>
void run_case(const std::shared_ptr<lockstep::ProcessGroup>& pg, const Case& c) {
  const int P = pg->size(), r = pg->rank();
  const int64_t B = c.batch;
  // Ranks start from DIFFERENT weights: DDP's construction broadcast must fix that.
  torch::manual_seed(1000 + r);
  auto model = std::make_shared<Net>();
  model->to(c.dtype);
  lockstep::DistributedDataParallel ddp(model, pg, c.options);
  if (c.hook) ddp.register_comm_hook(c.hook);
  torch::manual_seed(1000);  // the reference = rank 0's initial weights
  auto ref = std::make_shared<Net>();
  ref->to(c.dtype);
  if (c.strided_grads_on_odd_ranks && r % 2 == 1)
    for (auto& p : model->parameters())
      if (p.dim() == 2)  // column-major, and not an autograd view (zero_grad detaches it)
        p.mutable_grad() = torch::empty_strided(p.sizes(), {1, p.size(0)}, p.options()).zero_();
  auto opt = make_opt(c, ddp.parameters());
  auto ref_opt = make_opt(c, ref->parameters());

  auto loss_fn = [](const torch::Tensor& out, const torch::Tensor& y) {
    return torch::mse_loss(out, y);
  };
  for (int s = 0; s < c.steps; ++s) {
    for (int m = 0; m < c.accum; ++m) {
      // The full batch of P*B samples, identical on every rank.
      torch::manual_seed(77 + 31 * s + m);
      auto x =
          torch::randn({P * B, 128}, c.dtype).narrow(1, 0, std::is_same_v<Net, ConvBn> ? 128 : 6);
      auto y = torch::randn({P * B, 3}, c.dtype);
      // DDP: this rank's slice. Loss scaled by 1/accum by the user's choice.
      {
        std::optional<lockstep::ddp::NoSyncGuard> guard;
        if (m + 1 < c.accum) guard.emplace(ddp.no_sync());
        auto out = ddp(x.narrow(0, r * B, B), c.variant(s, r));
        (loss_fn(out, y.narrow(0, r * B, B)) / c.accum).backward();
      }
      // Reference, one process.
      if (!c.per_chunk_reference) {
        (loss_fn(ref->forward(x, 0), y) / c.accum).backward();
      } else {
        // Same gradient as the big batch's mean loss (equal chunk sizes), but each
        // chunk gets its own batch-norm statistics and branch choice, as on its rank.
        // Buffers follow DDP: every rank starts the forward from rank 0's buffers,
        // and rank 0's updated buffers are the ones kept.
        std::vector<torch::Tensor> before, after0;
        for (auto& b : ref->buffers()) before.push_back(b.clone());
        for (int q = 0; q < P; ++q) {
          {
            torch::NoGradGuard ng;
            auto bs = ref->buffers();
            for (size_t i = 0; i < bs.size(); ++i) bs[i].copy_(before[i]);
          }
          auto out = ref->forward(x.narrow(0, q * B, B), c.variant(s, q));
          (loss_fn(out, y.narrow(0, q * B, B)) / (c.accum * P)).backward();
          if (q == 0)
            for (auto& b : ref->buffers()) after0.push_back(b.clone());
        }
        torch::NoGradGuard ng;
        auto bs = ref->buffers();
        for (size_t i = 0; i < bs.size(); ++i) bs[i].copy_(after0[i]);
      }
    }
    opt->step();
    ref_opt->step();
    opt->zero_grad();
    ref_opt->zero_grad();
  }
  const std::string tag = c.name + " P=" + std::to_string(P);
  report(tag + " params", max_diff(model->parameters(), ref->parameters()), tol_for(c));
  // Grads are views into their buckets with gradient_as_bucket_view, and on shm (P > 1)
  // with shared buckets, whose allreduce then works on the peers' memory directly.
  const bool views = c.options.gradient_as_bucket_view ||
                     (P > 1 && pg->backend_name() == "shm" && c.options.shared_buckets);
  int64_t wrong = 0;
  for (const auto& b : ddp.reducer().buckets())
    for (size_t k = 0; k < b.param_indices.size(); ++k) {
      const auto& g = ddp.parameters()[b.param_indices[k]].grad();
      if (!g.defined()) continue;
      const char* slot = static_cast<const char*>(b.buffer.data_ptr()) +
                         b.offsets[k] * static_cast<int64_t>(b.buffer.element_size());
      wrong += (g.data_ptr() == slot) != views;
    }
  report(tag + (views ? " grads are bucket views" : " grads are their own tensors"),
         static_cast<double>(wrong), 0);
  if (r == 0 && !model->buffers().empty())
    report(tag + " buffers(rank0)", max_diff(model->buffers(), ref->buffers()), tol_for(c));
  const auto& st = ddp.last_step_stats();
  if (r == 0)
    std::printf(
        "rank 0 %s stats: steps %lld, buckets %lld, bytes %lld, backward %.2f ms, exposed comm "
        "%.2f ms\n",
        tag.c_str(), (long long)st.step, (long long)st.buckets, (long long)st.bytes_sent,
        st.backward_s * 1e3, st.exposed_comm_s * 1e3);
}

void run_all(const std::shared_ptr<lockstep::ProcessGroup>& pg) {
  {
    Case c;
    c.name = "mlp f64 sgd";
    run_case<Mlp>(pg, c);
    c.name = "mlp f64 adamw";
    c.adamw = true;
    run_case<Mlp>(pg, c);
  }
  {
    Case c;
    c.name = "mlp f32 sgd small-buckets+view";
    c.dtype = at::kFloat;
    c.tol = 2e-5;
    c.steps = 5;
    c.options.first_bucket_bytes = 64;
    c.options.bucket_cap_bytes = 1024;
    c.options.gradient_as_bucket_view = true;
    run_case<Mlp>(pg, c);
    // SGD: linear in the gradient, so fp16 rounding (rel. 2^-11 of each summand)
    // shows up proportionally (AdamW could flip the sign of near-zero components).
    c.name = "mlp f32 sgd fp16-hook";
    c.options.gradient_as_bucket_view = false;
    c.hook = lockstep::ddp::hooks::fp16_compress_hook();
    c.tol = 1e-3;
    run_case<Mlp>(pg, c);
    c.name = "mlp f32 sgd bf16-hook";
    c.hook = lockstep::ddp::hooks::bf16_compress_hook();
    c.tol = 5e-3;  // 8-bit mantissa
    run_case<Mlp>(pg, c);
  }
  {
    Case c;
    c.name = "convnet+bn f64 sgd";
    c.per_chunk_reference = true;
    run_case<ConvBn>(pg, c);
    c.name = "convnet+bn f64 adamw";
    c.adamw = true;
    run_case<ConvBn>(pg, c);
  }
  {
    Case c;
    c.name = "branchy unused f64 adamw";
    c.per_chunk_reference = true;
    c.adamw = true;
    c.steps = 5;
    c.options.find_unused_parameters = true;
    c.options.first_bucket_bytes = 128;  // several buckets: unused ones still launch in order
    c.options.bucket_cap_bytes = 512;
    // head_b: used on alternating ranks; late: unused everywhere for 2 steps.
    c.variant = [](int s, int r) -> int64_t { return ((s + r) % 2 ? 1 : 0) | (s >= 2 ? 2 : 0); };
    run_case<Branchy>(pg, c);
    c.name = "branchy unused f64 sgd";
    c.adamw = false;
    run_case<Branchy>(pg, c);
  }
  {
    Case c;
    c.name = "mixed in-place/copy paths mlp f64 sgd";
    c.strided_grads_on_odd_ranks = true;
    run_case<Mlp>(pg, c);
    c.name = "mixed in-place/copy paths private buckets mlp f64 sgd";
    c.options.shared_buckets = false;
    run_case<Mlp>(pg, c);
    c.name = "private buckets mlp f64 adamw";
    c.strided_grads_on_odd_ranks = false;
    c.adamw = true;
    run_case<Mlp>(pg, c);
    c.adamw = false;
    c.options.shared_buckets = true;
    c.name = "no_sync accum=3 mlp f64 sgd";
    c.accum = 3;
    run_case<Mlp>(pg, c);
    c.name = "no_sync accum=3 mlp f64 adamw";
    c.adamw = true;
    run_case<Mlp>(pg, c);
    c.name = "no_sync accum=2 branchy f64 adamw";
    c.accum = 2;
    c.per_chunk_reference = true;
    c.options.find_unused_parameters = true;
    c.variant = [](int s, int r) -> int64_t { return ((s + r) % 2 ? 1 : 0) | (s >= 2 ? 2 : 0); };
    run_case<Branchy>(pg, c);
  }
}

struct Skewed : torch::nn::Module {
  explicit Skewed(int rank) {
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, rank == 0 ? 3 : 4));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

void run_mismatch(const std::shared_ptr<lockstep::ProcessGroup>& pg) {
  auto model = std::make_shared<Skewed>(pg->rank());
  try {
    lockstep::DistributedDataParallel<Skewed> ddp(model, pg);
    report("mismatch raised", 1, 0);
  } catch (const lockstep::ddp::ModelMismatch& e) {
    const std::string msg = e.what();
    std::printf("rank %d got: %s\n", pg->rank(), msg.c_str());
    const bool ok =
        msg.find("fc2.weight") != std::string::npos && msg.find("rank 1") != std::string::npos &&
        msg.find("[3,8]") != std::string::npos && msg.find("[4,8]") != std::string::npos;
    report("mismatch names fc2.weight, both shapes and ranks", ok ? 0 : 1, 0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ddp_equivalence: DDP over P ranks against one process on the whole batch "
      "(run under lockstep-run or mpirun)",
      "ddp_equivalence"};
  bool mismatch = false;
  app.add_flag("--mismatch", mismatch,
               "instead: rank r>0 builds a different model; every rank must raise ModelMismatch");
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  try {
    auto pg = lockstep::init();
    tally::rank = pg->rank();
    tally::subject = "ddp";
    torch::set_num_threads(1);  // P ranks share few cores
    if (mismatch)
      run_mismatch(pg);
    else
      run_all(pg);
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    tally::check("no unexpected error", false, e.what());
  }
  return tally::finish();
}
