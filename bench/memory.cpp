// lockstep-bench memory: activation checkpointing (lockstep::checkpoint_wrapper on every
// layer) against the plain model: the activation memory autograd holds per step, the peak
// tensor memory and peak RSS of a step, and the step time.
//
//   lockstep-bench memory [--batch 4] [--seq-len 512] [--layers 8] [--d-model 64] ...
//
// The model is a transformer-like stack of the CTSM shape at long histories (max_len 512,
// 8 layers; causal self-attention with dropout + feed-forward, pre-norm, residuals) fed
// with random embeddings, trained with AdamW (dropout 0 as in configs/ctsm-demo.toml). Each variant
// runs in a fresh process (this program with --worker) so that its peak RSS is its own; tensor
// bytes come from the counting CPU allocator of bench/fsdp_memory.h. One compute thread per
// process.
#include "bench_util.h"
#include "commands.h"
#include "fsdp_memory.h"
#include "jobs.h"

#include <lockstep/numerics/checkpoint.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::bench {
namespace {

struct Options {
  int64_t batch = 4;
  int64_t seq_len = 512;
  int64_t layers = 8;
  int64_t d_model = 64;
  int64_t heads = 4;
  int64_t d_ff = 128;
  double dropout = 0.0;  // configs/ctsm-demo.toml
  int steps = 5;
  std::string mode;  // worker: plain, checkpointed or time
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

double mib(double bytes) { return bytes / (1 << 20); }

torch::nn::Sequential make_net(const Options& o, bool ckpt) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < o.layers; ++i) {
    auto c = checkpoint_wrapper(Layer(o));
    c->set_enabled(ckpt);
    net->push_back(c);
  }
  return net;
}

// One training step of `net`; `held` gets the tensor bytes alive from the end of the
// forward to the backward (autograd's saved activations, and the output).
struct Trainer {
  Trainer(const Options& o, bool ckpt)
      : net(make_net(o, ckpt)),
        opt(net->parameters(), torch::optim::AdamWOptions(1e-4)),
        x(torch::randn({o.batch, o.seq_len, o.d_model})),
        y(torch::randn({o.batch, o.seq_len, o.d_model})) {}
  void step() {
    opt.zero_grad();
    const int64_t before = live_tensor_bytes();
    auto loss = torch::mse_loss(net->forward(x), y);
    held = live_tensor_bytes() - before;
    loss.backward();
    opt.step();
  }
  torch::nn::Sequential net;
  torch::optim::AdamW opt;
  torch::Tensor x, y;
  int64_t held = 0;
};

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Memory of one variant in this process (its peak RSS is its own); prints RESULT lines.
int memory_worker(const Options& o) {
  install_counting_allocator();
  Trainer t(o, o.mode == "checkpointed");
  t.step();  // creates gradients and optimizer state: the model state is steady from here
  const int64_t base = live_tensor_bytes();
  reset_peak_tensor_bytes();
  t.step();
  report_result(0, "held_bytes", static_cast<double>(t.held));
  report_result(0, "peak_above_state_bytes", static_cast<double>(peak_tensor_bytes() - base));
  report_result(0, "state_bytes", static_cast<double>(base));
  report_result(0, "vmhwm_bytes", static_cast<double>(read_proc_memory().hwm));
  return 0;
}

// Step time of both variants, their steps alternating so that a change in the machine's
// load hits both alike: wall and CPU seconds (one thread: CPU time is the work done).
int time_worker(const Options& o) {
  install_counting_allocator();
  Trainer plain(o, false), ckpt(o, true);
  plain.step();
  ckpt.step();
  std::vector<double> wall[2], cpu[2];
  for (int s = 0; s < o.steps; ++s)
    for (int v = 0; v < 2; ++v) {
      const double w0 = now_s(), c0 = cpu_s();
      (v == 0 ? plain : ckpt).step();
      wall[v].push_back(now_s() - w0);
      cpu[v].push_back(cpu_s() - c0);
    }
  for (int v = 0; v < 2; ++v) {
    const std::string k = v == 0 ? "plain" : "ckpt";
    report_result(0, "wall_s_" + k, median(wall[v]));
    report_result(0, "cpu_s_" + k, median(cpu[v]));
  }
  return 0;
}

// mode: "plain" / "checkpointed" (memory of one variant) or "time" (both, alternating).
std::string worker_command(const Options& o, const std::string& mode) {
  char args[512];
  std::snprintf(args, sizeof args,
                " memory --worker %s --batch %lld --seq-len %lld --layers %lld "
                "--d-model %lld --heads %lld --d-ff %lld --dropout %g --steps %d",
                mode.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq_len),
                static_cast<long long>(o.layers), static_cast<long long>(o.d_model),
                static_cast<long long>(o.heads), static_cast<long long>(o.d_ff), o.dropout,
                o.steps);
  return rank_environment() + self_command() + args;
}

bool run_worker(const Options& o, const std::string& mode, std::map<std::string, double>& out) {
  const JobOutput job = run_job_quiet(worker_command(o, mode));
  out = job.results;
  if (job.status == 0 && !out.empty()) return true;
  std::fprintf(stderr, "memory worker (%s) failed:\n%s", mode.c_str(), job.output.c_str());
  return false;
}

int driver(const Options& o) {
  std::printf(
      "activation checkpointing: %lld layers, d_model %lld, %lld heads, d_ff %lld, dropout %g; "
      "batch %lld x seq_len %lld; AdamW; 1 thread per process; step time: median of %d "
      "steps, the variants alternating\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.d_model),
      static_cast<long long>(o.heads), static_cast<long long>(o.d_ff), o.dropout,
      static_cast<long long>(o.batch), static_cast<long long>(o.seq_len), o.steps);
  std::map<std::string, double> m[2], t;
  if (!run_worker(o, "plain", m[0]) || !run_worker(o, "checkpointed", m[1]) ||
      !run_worker(o, "time", t))
    return 1;
  Table table(
      {"variant", "activations MiB", "step peak MiB", "peak RSS MiB", "step ms", "step CPU ms"});
  const char* names[2] = {"plain", "checkpointed"};
  const char* keys[2] = {"plain", "ckpt"};
  for (int v = 0; v < 2; ++v)
    table.add({names[v], fmt(mib(m[v]["held_bytes"]), 1),
               fmt(mib(m[v]["peak_above_state_bytes"]), 1), fmt(mib(m[v]["vmhwm_bytes"]), 1),
               fmt(t[std::string("wall_s_") + keys[v]] * 1e3, 1),
               fmt(t[std::string("cpu_s_") + keys[v]] * 1e3, 1)});
  auto ratio = [&](const char* k) { return fmt(m[1][k] / m[0][k]) + "x"; };
  table.add({"ratio", ratio("held_bytes"), ratio("peak_above_state_bytes"), ratio("vmhwm_bytes"),
             fmt(t["wall_s_ckpt"] / t["wall_s_plain"]) + "x",
             fmt(t["cpu_s_ckpt"] / t["cpu_s_plain"]) + "x"});
  std::printf("%s", table.str().c_str());
  std::printf(
      "activations: tensor bytes autograd holds from the end of forward to backward; step "
      "peak: the most tensor bytes live during a step above the model state (%.1f MiB: "
      "parameters, gradients, AdamW moments); peak RSS: the process's VmHWM (a fresh process "
      "per variant); step CPU: the process's CPU time per step (insensitive to other load).\n"
      "targets: activations <= 0.40x, step time <= 1.40x\n",
      mib(m[0]["state_bytes"]));
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
  app->add_option("--worker", o->mode, "run one measurement: plain, checkpointed or time")
      ->check(CLI::IsMember({"plain", "checkpointed", "time"}))
      ->group(kWorkerOnly);
  return {app, [o] {
            if (o->mode.empty()) return driver(*o);
            return o->mode == "time" ? time_worker(*o) : memory_worker(*o);
          }};
}

}  // namespace lockstep::bench
