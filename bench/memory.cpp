// lockstep-bench memory: selective activation checkpointing (lockstep::numerics::CheckpointPolicy:
// whole layers or their attention / MLP sub-blocks, every k-th layer, dropout masks kept or
// drawn again) against the plain model: the activation memory autograd holds per step, the
// peak tensor memory and peak RSS of a step, and the step time, each as a ratio to the
// plain model measured in the same run.
//
//   lockstep-bench memory [--dropout 0.1] [--variants layer:1,layer:2,attention:1,...]
//
// The model is a transformer-like stack of the CTSM shape at long histories (max_len 512,
// 8 layers; causal self-attention with dropout on the attention weights and both residual
// branches + feed-forward, pre-norm, residuals) fed with random embeddings, trained with
// AdamW. Its layers run through numerics::run_residual_layer with the variant's plan and use
// numerics::Dropout. Each variant's memory is measured in a fresh process (this program with
// --worker memory) so that its peak RSS is its own; tensor bytes come from the counting CPU
// allocator of bench/fsdp_memory.h. The step times of all variants come from one process
// (--worker time) whose steps go round the variants, so that a change in the machine's load
// hits them alike. One compute thread per process.
#include "bench_util.h"
#include "commands.h"
#include "fsdp_memory.h"
#include "jobs.h"

#include <lockstep/error.h>
#include <lockstep/numerics/activation_checkpoint_policy.h>
#include <lockstep/numerics/dropout.h>
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
  double dropout = 0.1;
  int steps = 5;
  // BLOCKS:K[:redraw], comma separated; "plain" is always measured first.
  std::string variants =
      "layer:1,layer:2,layer:3,layer:4,attention:1,attention:2,mlp:1,layer:1:redraw,"
      "attention:1:redraw";
  std::string mode;     // worker: memory or time
  int64_t variant = 0;  // memory worker: index into plain + variants
};

using TensorVec = std::vector<torch::Tensor>;
using numerics::CheckpointPolicy;
using numerics::LayerCheckpointing;
using numerics::ResidualLayer;

// "plain" or BLOCKS:K[:redraw] (BLOCKS: layer, attention, mlp; redraw: masks drawn again).
CheckpointPolicy parse_variant(const std::string& spec) {
  CheckpointPolicy p;
  if (spec == "plain") return p;
  const std::vector<std::string> parts = split_csv([&] {
    std::string s = spec;
    for (char& c : s)
      if (c == ':') c = ',';
    return s;
  }());
  LOCKSTEP_CHECK(parts.size() == 2 || (parts.size() == 3 && parts[2] == "redraw"),
                 "lockstep-bench memory: variant '", spec,
                 "' is not BLOCKS:K or BLOCKS:K:redraw (e.g. layer:2, attention:1:redraw)");
  p.enabled = true;
  p.blocks = numerics::parse_checkpoint_blocks(parts[0]);
  p.every = std::stoll(parts[1]);
  LOCKSTEP_CHECK(p.every >= 1, "lockstep-bench memory: variant '", spec, "': K must be >= 1");
  p.keep_dropout_masks = parts.size() == 2;
  return p;
}

std::vector<std::string> variant_list(const Options& o) {
  std::vector<std::string> v{"plain"};
  for (const auto& s : split_csv(o.variants)) v.push_back(s);
  return v;
}

// Causal self-attention branch: dropout on the attention weights and on the output.
struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const Options& o) : heads(o.heads) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    qkv = register_module("qkv", torch::nn::Linear(o.d_model, 3 * o.d_model));
    proj = register_module("proj", torch::nn::Linear(o.d_model, o.d_model));
    drop = register_module("drop", numerics::Dropout(o.dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), L = x.size(1), D = x.size(2), dh = D / heads;
    auto t = qkv(ln(x)).view({B, L, 3, heads, dh}).permute({2, 0, 3, 1, 4});
    auto scores = t[0].matmul(t[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(dh));
    auto future = torch::ones({L, L}, torch::kBool).triu(1);
    auto att = drop(torch::softmax(scores.masked_fill(future, -INFINITY), -1));
    return drop(proj(att.matmul(t[2]).transpose(1, 2).reshape({B, L, D})));
  }
  int64_t heads;
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  numerics::Dropout drop{nullptr};
};
TORCH_MODULE(Attention);

// Feed-forward branch.
struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(const Options& o) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
    ff1 = register_module("ff1", torch::nn::Linear(o.d_model, o.d_ff));
    ff2 = register_module("ff2", torch::nn::Linear(o.d_ff, o.d_model));
    drop = register_module("drop", numerics::Dropout(o.dropout));
  }
  torch::Tensor forward(const torch::Tensor& x) { return drop(ff2(torch::gelu(ff1(ln(x))))); }
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear ff1{nullptr}, ff2{nullptr};
  numerics::Dropout drop{nullptr};
};
TORCH_MODULE(FeedForward);

// One pre-norm layer, checkpointed as its plan says.
struct LayerImpl : torch::nn::Module {
  LayerImpl(const Options& o, LayerCheckpointing plan) : plan(plan) {
    attn = register_module("attn", Attention(o));
    ff = register_module("ff", FeedForward(o));
  }
  torch::Tensor forward(const torch::Tensor& h) {
    ResidualLayer layer;
    layer.attention = [a = attn](const torch::Tensor& x, const TensorVec&) mutable { return a(x); };
    layer.attention_params = attn->parameters();
    layer.mlp = [f = ff](const torch::Tensor& x) mutable { return f(x); };
    layer.mlp_params = ff->parameters();
    return numerics::run_residual_layer(plan, layer, h);
  }
  LayerCheckpointing plan;
  Attention attn{nullptr};
  FeedForward ff{nullptr};
};
TORCH_MODULE(Layer);

double mib(double bytes) { return bytes / (1 << 20); }

torch::nn::Sequential make_net(const Options& o, const CheckpointPolicy& policy) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < o.layers; ++i) net->push_back(Layer(o, policy.for_layer(i)));
  return net;
}

// One training step of `net`; `held` gets the tensor bytes alive from the end of the
// forward to the backward (autograd's saved activations, kept masks, and the output).
struct Trainer {
  Trainer(const Options& o, const CheckpointPolicy& policy)
      : net(make_net(o, policy)),
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
  Trainer t(o, parse_variant(variant_list(o).at(static_cast<size_t>(o.variant))));
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

// Step time of every variant, their steps going round the variants so that a change in the
// machine's load hits all alike: wall and CPU seconds (one thread: CPU time is the work).
int time_worker(const Options& o) {
  install_counting_allocator();
  const std::vector<std::string> names = variant_list(o);
  std::vector<std::unique_ptr<Trainer>> t;
  for (const auto& n : names) {
    t.push_back(std::make_unique<Trainer>(o, parse_variant(n)));
    t.back()->step();  // warm-up
  }
  std::vector<std::vector<double>> wall(names.size()), cpu(names.size());
  for (int s = 0; s < o.steps; ++s)
    for (size_t v = 0; v < names.size(); ++v) {
      const double w0 = now_s(), c0 = cpu_s();
      t[v]->step();
      wall[v].push_back(now_s() - w0);
      cpu[v].push_back(cpu_s() - c0);
    }
  for (size_t v = 0; v < names.size(); ++v) {
    report_result(0, "wall_s_" + std::to_string(v), median(wall[v]));
    report_result(0, "cpu_s_" + std::to_string(v), median(cpu[v]));
  }
  return 0;
}

std::string worker_command(const Options& o, const std::string& mode, size_t variant) {
  char args[768];
  std::snprintf(args, sizeof args,
                " memory --worker %s --variant %zu --variants %s --batch %lld --seq-len %lld "
                "--layers %lld --d-model %lld --heads %lld --d-ff %lld --dropout %g --steps %d",
                mode.c_str(), variant, o.variants.c_str(), static_cast<long long>(o.batch),
                static_cast<long long>(o.seq_len), static_cast<long long>(o.layers),
                static_cast<long long>(o.d_model), static_cast<long long>(o.heads),
                static_cast<long long>(o.d_ff), o.dropout, o.steps);
  return rank_environment() + self_command() + args;
}

bool run_worker(const Options& o, const std::string& mode, size_t variant,
                std::map<std::string, double>& out) {
  const JobOutput job = run_job_quiet(worker_command(o, mode, variant));
  out = job.results;
  if (job.status == 0 && !out.empty()) return true;
  std::fprintf(stderr, "memory worker (%s %zu) failed:\n%s", mode.c_str(), variant,
               job.output.c_str());
  return false;
}

// "layer, every 2" or "attention, every 1, masks redrawn".
std::string describe(const std::string& spec) {
  const CheckpointPolicy p = parse_variant(spec);
  if (!p.enabled) return "plain";
  return std::string(numerics::checkpoint_blocks_name(p.blocks)) + ", every " +
         std::to_string(p.every) + (p.keep_dropout_masks ? "" : ", masks redrawn");
}

// The table of every variant against plain (row 0) and the settings that meet the targets.
void print_report(const std::vector<std::string>& names,
                  const std::vector<std::map<std::string, double>>& m,
                  std::map<std::string, double>& t) {
  Table table({"variant", "activations MiB", "ratio", "step peak MiB", "ratio", "peak RSS MiB",
               "step ms", "ratio", "step CPU ms", "ratio"});
  std::string meets;
  for (size_t v = 0; v < names.size(); ++v) {
    const std::string i = std::to_string(v);
    const double held = m[v].at("held_bytes") / m[0].at("held_bytes");
    const double wall = t["wall_s_" + i] / t["wall_s_0"], cpu = t["cpu_s_" + i] / t["cpu_s_0"];
    table.add({describe(names[v]), fmt(mib(m[v].at("held_bytes")), 1), fmt(held) + "x",
               fmt(mib(m[v].at("peak_above_state_bytes")), 1),
               fmt(m[v].at("peak_above_state_bytes") / m[0].at("peak_above_state_bytes")) + "x",
               fmt(mib(m[v].at("vmhwm_bytes")), 1), fmt(t["wall_s_" + i] * 1e3, 1), fmt(wall) + "x",
               fmt(t["cpu_s_" + i] * 1e3, 1), fmt(cpu) + "x"});
    if (v > 0 && held <= 0.40 && cpu <= 1.40 && wall <= 1.40)
      meets += (meets.empty() ? "" : "; ") + describe(names[v]);
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "activations: tensor bytes autograd holds from the end of forward to backward (kept "
      "dropout masks included); step peak: the most tensor bytes live during a step above the "
      "model state (%.1f MiB: parameters, gradients, AdamW moments); peak RSS: the process's "
      "VmHWM (a fresh process per variant); step CPU: the process's CPU time per step "
      "(insensitive to other load). Ratios: to plain, from the same run.\n"
      "targets: activations <= 0.40x and step time (wall and CPU) <= 1.40x; met by: %s\n",
      mib(m[0].at("state_bytes")), meets.empty() ? "none" : meets.c_str());
}

int driver(const Options& o) {
  const std::vector<std::string> names = variant_list(o);
  for (const auto& n : names) parse_variant(n);  // a bad variant fails before any run
  std::printf(
      "selective activation checkpointing: %lld layers, d_model %lld, %lld heads, d_ff %lld, "
      "dropout %g; batch %lld x seq_len %lld; AdamW; 1 thread per process; step time: median "
      "of %d steps, the variants taking turns\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.d_model),
      static_cast<long long>(o.heads), static_cast<long long>(o.d_ff), o.dropout,
      static_cast<long long>(o.batch), static_cast<long long>(o.seq_len), o.steps);
  std::vector<std::map<std::string, double>> m(names.size());
  std::map<std::string, double> t;
  for (size_t v = 0; v < names.size(); ++v)
    if (!run_worker(o, "memory", v, m[v])) return 1;
  if (!run_worker(o, "time", 0, t)) return 1;
  print_report(names, m, t);
  return 0;
}

}  // namespace

Command memory_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app = bench.add_subcommand(
      "memory", "selective activation checkpointing: activation memory, peak RSS and step time");
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
  app->add_option("--variants", o->variants,
                  "checkpointing policies to compare with plain: BLOCKS:K[:redraw], BLOCKS one "
                  "of layer, attention, mlp; K: every K-th layer; redraw: dropout masks drawn "
                  "again in backward instead of kept")
      ->capture_default_str();
  app->add_option("--worker", o->mode, "run one measurement: memory or time")
      ->check(CLI::IsMember({"memory", "time"}))
      ->group(kWorkerOnly);
  app->add_option("--variant", o->variant, "memory worker: the variant's index")
      ->group(kWorkerOnly);
  return {app, [o] {
            if (o->mode.empty()) return driver(*o);
            return o->mode == "time" ? time_worker(*o) : memory_worker(*o);
          }};
}

}  // namespace lockstep::bench
