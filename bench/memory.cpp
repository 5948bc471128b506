// lockstep-bench memory: activation checkpointing (lockstep::checkpoint_wrapper on every
// layer) against the plain model: the activation memory autograd holds per step, the peak
// tensor memory and peak RSS of a step, and the step time.
//
//   lockstep-bench memory [--batch 4] [--seq-len 512] [--layers 8] [--d-model 64] ...
//
// The model is a transformer-like stack of the CTSM shape at long histories (max_len 512,
// 8 layers; causal self-attention with dropout + feed-forward, pre-norm, residuals) fed
// with random embeddings, trained with AdamW. Each variant runs in a fresh process (this
// program with --worker) so that its peak RSS is its own; tensor bytes come from the
// counting CPU allocator of bench/fsdp_memory.h. One compute thread per process.
#include "bench_util.h"
#include "commands.h"
#include "fsdp_memory.h"
#include "jobs.h"

#include <lockstep/numerics/checkpoint.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

namespace lockstep::bench {
namespace {

struct Options {
  int64_t batch = 4;
  int64_t seq_len = 512;
  int64_t layers = 8;
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t d_ff = 128;
  double dropout = 0.1;
  int steps = 5;
  bool worker = false;
  bool checkpoint = false;  // worker: this variant
};

// One pre-norm layer: causal multi-head self-attention, then a feed-forward block.
struct LayerImpl : torch::nn::Module {
  LayerImpl(const Options& o) : heads(o.heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    qkv = register_module("qkv", torch::nn::Linear(o.d_model, 3 * o.d_model));
    proj = register_module("proj", torch::nn::Linear(o.d_model, o.d_model));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    ff1 = register_module("ff1", torch::nn::Linear(o.d_model, o.d_ff));
    ff2 = register_module("ff2", torch::nn::Linear(o.d_ff, o.d_model));
    drop = register_module("drop", torch::nn::Dropout(o.dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2), dh = D / heads;
    auto t = qkv(ln1(x)).view({B, L, 3, heads, dh}).permute({2, 0, 3, 1, 4});
    auto scores = t[0].matmul(t[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(dh));
    auto future = torch::ones({L, L}, torch::kBool).triu(1);
    auto att = drop(torch::softmax(scores.masked_fill(future, -INFINITY), -1));
    auto h = x + drop(proj(att.matmul(t[2]).transpose(1, 2).reshape({B, L, D})));
    return h + drop(ff2(torch::gelu(ff1(ln2(h)))));
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, ff1{nullptr}, ff2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Layer);

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// One variant in this process; prints RESULT lines.
int worker(const Options& o) {
  install_counting_allocator();
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < o.layers; ++i) {
    auto c = checkpoint_wrapper(Layer(o));
    c->set_enabled(o.checkpoint);
    net->push_back(c);
  }
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(1e-4));
  const auto x = torch::randn({o.batch, o.seq_len, o.d_model});
  const auto y = torch::randn({o.batch, o.seq_len, o.d_model});
  int64_t held = 0;  // activation bytes held between forward and backward (last step)
  auto step = [&] {
    opt.zero_grad();
    const int64_t before = live_tensor_bytes();
    auto loss = torch::mse_loss(net->forward(x), y);
    held = live_tensor_bytes() - before;
    loss.backward();
    opt.step();
  };
  step();  // creates gradients and optimizer state: the model state is steady from here
  const int64_t base = live_tensor_bytes();
  reset_peak_tensor_bytes();
  const auto times = time_runs(step, nullptr, {0, o.steps, o.steps, 0});
  report_result(0, "held_bytes", static_cast<double>(held));
  report_result(0, "peak_above_state_bytes", static_cast<double>(peak_tensor_bytes() - base));
  report_result(0, "state_bytes", static_cast<double>(base));
  report_result(0, "vmhwm_bytes", static_cast<double>(read_proc_memory().hwm));
  report_result(0, "step_s", median(times));
  return 0;
}

std::string worker_command(const Options& o, bool ckpt) {
  char args[512];
  std::snprintf(args, sizeof args,
                " memory --worker --checkpoint %d --batch %lld --seq-len %lld --layers %lld "
                "--d-model %lld --heads %lld --d-ff %lld --dropout %g --steps %d",
                ckpt ? 1 : 0, static_cast<long long>(o.batch), static_cast<long long>(o.seq_len),
                static_cast<long long>(o.layers), static_cast<long long>(o.d_model),
                static_cast<long long>(o.heads), static_cast<long long>(o.d_ff), o.dropout,
                o.steps);
  return rank_environment() + self_command() + args;
}

int driver(const Options& o) {
  std::printf(
      "activation checkpointing: %lld layers, d_model %lld, %lld heads, d_ff %lld, dropout %g; "
      "batch %lld x seq_len %lld; AdamW; 1 thread; median of %d steps; a fresh process each\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.d_model),
      static_cast<long long>(o.heads), static_cast<long long>(o.d_ff), o.dropout,
      static_cast<long long>(o.batch), static_cast<long long>(o.seq_len), o.steps);
  std::map<std::string, double> r[2];
  for (int ck = 0; ck < 2; ++ck) {
    const JobOutput job = run_job_quiet(worker_command(o, ck == 1));
    if (job.status != 0 || job.results.count("step_s") == 0) {
      std::fprintf(stderr, "memory worker failed:\n%s", job.output.c_str());
      return 1;
    }
    r[ck] = job.results;
  }
  Table t({"variant", "activations MiB", "step peak MiB", "peak RSS MiB", "step ms"});
  const char* names[2] = {"plain", "checkpointed"};
  for (int ck = 0; ck < 2; ++ck)
    t.add({names[ck], fmt(r[ck]["held_bytes"] / (1 << 20), 1),
           fmt(r[ck]["peak_above_state_bytes"] / (1 << 20), 1),
           fmt(r[ck]["vmhwm_bytes"] / (1 << 20), 1), fmt(r[ck]["step_s"] * 1e3, 1)});
  auto ratio = [&](const char* k) { return fmt(r[1][k] / r[0][k]) + "x"; };
  t.add({"ratio", ratio("held_bytes"), ratio("peak_above_state_bytes"), ratio("vmhwm_bytes"),
         ratio("step_s")});
  std::printf("%s", t.str().c_str());
  std::printf(
      "activations: tensor bytes autograd holds from the end of forward to backward; step "
      "peak: the most tensor bytes live during a step above the model state (%.1f MiB: "
      "parameters, gradients, AdamW moments); peak RSS: the process's VmHWM.\n"
      "targets: activations <= 0.40x, step time <= 1.40x\n",
      mib(static_cast<int64_t>(r[0]["state_bytes"])));
  return 0;
}

}  // namespace

Command memory_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app = bench.add_subcommand(
      "memory", "activation checkpointing: activation memory, peak RSS and step time");
  app->add_option("--batch", o->batch, "sequences per step")->capture_default_str();
  app->add_option("--seq-len", o->seq_len, "sequence length (history)")->capture_default_str();
  app->add_option("--layers", o->layers, "layers")->capture_default_str();
  app->add_option("--d-model", o->d_model, "model width")->capture_default_str();
  app->add_option("--heads", o->heads, "attention heads")->capture_default_str();
  app->add_option("--d-ff", o->d_ff, "feed-forward width")->capture_default_str();
  app->add_option("--dropout", o->dropout, "dropout")->capture_default_str();
  app->add_option("--steps", o->steps, "timed steps (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--worker", o->worker, "run one variant")->group(kWorkerOnly);
  app->add_option("--checkpoint", o->checkpoint, "worker: checkpointed variant")
      ->group(kWorkerOnly);
  return {app, [o] { return o->worker ? worker(*o) : driver(*o); }};
}

}  // namespace lockstep::bench
