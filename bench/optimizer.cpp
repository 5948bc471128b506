// lockstep-bench optimizer: the memory per parameter (parameter + gradient + optimizer
// states, as held between steps) and the step time of torch::optim::AdamW in fp32 against
// lockstep::numerics::AnyPrecisionAdamW in fp32, and in pure bf16 with and without Kahan
// summation, on the same parameter count, in one run.
//
//   lockstep-bench optimizer [--params 20000000] [--steps 10]
//
// One process; the optimizers run libtorch's pointwise kernels on its intra-op threads.
#include "bench_util.h"
#include "commands.h"

#include <lockstep/numerics/anyprecision_adamw.h>
#include <torch/torch.h>

#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::bench {
namespace {

struct Options {
  int64_t params = 20'000'000;
  int steps = 10;
};

using Factory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>&)>;

struct Variant {
  std::string name;
  c10::ScalarType param_dtype = c10::kFloat;
  Factory make;
};

// Square-ish tensors of 1M elements (and the rest), like the layers of a model.
std::vector<torch::Tensor> make_params(int64_t total, c10::ScalarType dtype) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> ps;
  for (int64_t left = total; left > 0;) {
    const int64_t n = std::min<int64_t>(left, 1024 * 1024);
    auto p = (torch::randn({n}) * 0.02).to(dtype).requires_grad_(true);
    p.mutable_grad() = (torch::randn({n}) * 1e-3).to(dtype);
    ps.push_back(p);
    left -= n;
  }
  return ps;
}

double process_cpu_s() {  // all threads of this process: immune to other jobs' load
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

// Parameters, gradients and every tensor of the optimizer's per-parameter states.
int64_t held_bytes(const std::vector<torch::Tensor>& ps, const torch::optim::Optimizer& opt) {
  int64_t b = 0;
  for (const auto& p : ps) b += bytes_of(p) + bytes_of(p.grad());
  for (const auto& [key, st] : opt.state()) {
    if (const auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(st.get()))
      b += bytes_of(a->exp_avg()) + bytes_of(a->exp_avg_sq()) + bytes_of(a->max_exp_avg_sq());
    if (const auto* s = dynamic_cast<const numerics::AnyPrecisionAdamWParamState*>(st.get()))
      b += bytes_of(s->exp_avg()) + bytes_of(s->exp_avg_sq()) + bytes_of(s->compensation());
  }
  return b;
}

std::vector<Variant> variants() {
  using numerics::AnyPrecisionAdamW;
  using numerics::AnyPrecisionAdamWOptions;
  auto any = [](AnyPrecisionAdamWOptions o) -> Factory {
    return [o](const std::vector<torch::Tensor>& ps) {
      return std::make_unique<AnyPrecisionAdamW>(ps, o);
    };
  };
  const auto bf16 = AnyPrecisionAdamWOptions(1e-3)
                        .momentum_dtype(c10::kBFloat16)
                        .variance_dtype(c10::kBFloat16)
                        .compensation_buffer_dtype(c10::kBFloat16);
  return {
      {"torch AdamW fp32", c10::kFloat,
       [](const std::vector<torch::Tensor>& ps) {
         return std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-3));
       }},
      {"AnyPrecision fp32", c10::kFloat, any(AnyPrecisionAdamWOptions(1e-3))},
      {"AnyPrecision bf16 + Kahan", c10::kBFloat16,
       any(AnyPrecisionAdamWOptions(bf16).use_kahan_summation(true))},
      {"AnyPrecision bf16", c10::kBFloat16, any(bf16)},
  };
}

int run(const Options& o) {
  std::printf(
      "optimizer step on %lld parameters (tensors of 1M), %d intra-op threads, median of "
      "%d steps after 2 warm-up steps:\n",
      static_cast<long long>(o.params), at::get_num_threads(), o.steps);
  Table t(
      {"optimizer", "bytes/param", "x of AdamW fp32", "step ms", "CPU ms", "CPU x of AdamW fp32"});
  double base_bytes = 0, base_cpu = 0;
  for (const auto& v : variants()) {
    auto ps = make_params(o.params, v.param_dtype);
    auto opt = v.make(ps);
    std::vector<double> cpu;  // warm-up steps included; dropped below
    const auto times = time_runs(
        [&] {
          const double c0 = process_cpu_s();
          opt->step();
          cpu.push_back(process_cpu_s() - c0);
        },
        nullptr, {.warmup = 2, .min_iters = o.steps, .max_iters = o.steps, .min_seconds = 0});
    cpu.erase(cpu.begin(), cpu.begin() + 2);
    const double per_param = double(held_bytes(ps, *opt)) / double(o.params);
    const double cpu_ms = median(cpu) * 1e3;
    if (base_bytes == 0) base_bytes = per_param, base_cpu = cpu_ms;
    t.add({v.name, fmt(per_param, 1), fmt(per_param / base_bytes) + "x",
           fmt(median(times) * 1e3, 1), fmt(cpu_ms, 1), fmt(cpu_ms / base_cpu) + "x"});
  }
  std::printf("%s", t.str().c_str());
  std::printf(
      "bytes/param: parameter + gradient + optimizer state held between steps; a step "
      "also allocates temporaries the size of one parameter tensor. step ms: wall clock; CPU "
      "ms: CPU time of the process (all threads), which other jobs' load does not inflate.\n");
  return 0;
}

}  // namespace

Command optimizer_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app = bench.add_subcommand(
      "optimizer", "memory per parameter and step time: AdamW fp32 vs AnyPrecision AdamW bf16");
  app->add_option("--params", o->params, "parameters to optimize")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--steps", o->steps, "timed steps (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return {app, [o] { return run(*o); }};
}

}  // namespace lockstep::bench
