// lockstep-bench compression: codec throughput per bit width, and the compressed allreduce
// and DDP step over thin links (loopback shaped by tbf inside a private network namespace
// that this program creates and always removes), uncompressed vs QSGD, in one run.
//
//   lockstep-bench compression [--nproc 2] [--rates 1gbit,10gbit,25gbit] [--skip-net] [--steps 5]
//                              [--skip-ddp]
//
// The driver measures the codec itself, then for each rate runs
//   ip netns exec NS lockstep-run --nproc-per-node N --master-port 0 SELF compression --worker
// with LOCKSTEP_BACKEND=gloo; workers print "RESULT key seconds" lines on rank 0.
#include "bench_util.h"
#include "commands.h"
#include "jobs.h"

#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/lockstep.h>
#include <lockstep/models/mlp.h>
#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/parallel/ddp/hooks/qsgd_hook.h>
#include <torch/torch.h>

#include <ATen/ATen.h>

#include <unistd.h>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>

namespace lockstep::bench {
namespace {

struct Options {
  int nproc = 2, steps = 5;
  std::string rates = "1gbit,10gbit,25gbit";
  bool skip_net = false;
  bool skip_ddp = false;  // thin links: the allreduce only (bench/quick.py)
  bool worker = false;
};

double cpu_now() {  // this thread's CPU time: "per core" throughput, immune to other load
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// One core's memory bandwidth: a 64 MiB copy (read + write), the ceiling of any codec
// pass that streams its input and output from memory.
double stream_copy_gbs(std::vector<float>& a, std::vector<float>& b) {
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    const double t0 = cpu_now();
    std::memcpy(b.data(), a.data(), a.size() * 4);
    t.push_back(cpu_now() - t0);
  }
  return double(a.size()) * 4 / 1e9 / median(t);
}

struct CodecSpeed {
  double encode = 0, decode = 0, decode_add = 0, worst = 0;  // GB/s of float32; error/unit
  int64_t bytes = 0;
};

// Encode, decode and decode-accumulate of n float32 values on the active path (thread CPU
// time, median of 5), and the largest error in units of its bucket's step.
CodecSpeed codec_speed(const std::vector<float>& x, std::vector<float>& y, int bits) {
  using namespace lockstep::compress;
  const int64_t n = int64_t(x.size());
  CodecOptions o{bits, 128, true};
  std::vector<uint8_t> buf(size_t(encoded_bytes(n, o)));
  std::vector<double> te, td, ta;
  for (int r = 0; r < 5; ++r) {
    const double t0 = cpu_now();
    encode(x.data(), n, o, StreamKey{1, uint64_t(r), 0, 1}, 0, buf.data());
    const double t1 = cpu_now();
    decode_add(buf.data(), n, o, y.data());
    const double t2 = cpu_now();
    decode(buf.data(), n, o, y.data());
    const double t3 = cpu_now();
    te.push_back(t1 - t0);
    ta.push_back(t2 - t1);
    td.push_back(t3 - t2);
  }
  CodecSpeed s;
  for (int64_t b = 0; b < n; b += 128) {  // verification: |err| < unit in every bucket
    float lo = x[size_t(b)], hi = lo;
    for (int64_t i = b; i < b + 128; ++i)
      lo = std::min(lo, x[size_t(i)]), hi = std::max(hi, x[size_t(i)]);
    const double unit = unit_for(lo, hi, bits);
    for (int64_t i = b; i < b + 128; ++i)
      s.worst = std::max(s.worst, std::fabs(double(y[size_t(i)]) - x[size_t(i)]) / unit);
  }
  const double gb = double(n) * 4 / 1e9;
  s.encode = gb / median(te);
  s.decode = gb / median(td);
  s.decode_add = gb / median(ta);
  s.bytes = int64_t(buf.size());
  return s;
}

void codec_table() {
  using namespace lockstep::compress;
  const int64_t n = 16 << 20;  // 64 MiB of float32
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  std::mt19937 g(1);
  std::normal_distribution<float> d;
  for (auto& v : x) v = d(g);
  const double copy = stream_copy_gbs(x, y);
  const std::string best = codec_isa();
  Table t({"bits", "encode GB/s", "decode GB/s", "decode-add GB/s", "enc+dec GB/s", "ratio vs fp32",
           "max err/unit"});
  for (int bits = 1; bits <= 8; ++bits) {
    const CodecSpeed s = codec_speed(x, y, bits);
    t.add({std::to_string(bits), fmt(s.encode), fmt(s.decode), fmt(s.decode_add),
           fmt(1 / (1 / s.encode + 1 / s.decode)), fmt(double(n) * 4 / double(s.bytes), 1) + "x",
           fmt(s.worst, 3)});
  }
  std::printf(
      "QSGD codec on the %s path, float32, 64 MiB, bucket 128, stochastic rounding, 1 core "
      "(thread CPU time, median of 5; GB/s of float32 input); one core's memory copy: %s GB/s\n%s",
      best.c_str(), fmt(copy).c_str(), t.str().c_str());
  // 4-bit on every path this CPU runs: the SIMD paths against the baseline one.
  Table p({"path", "encode GB/s", "decode-add GB/s", "encode vs generic", "decode-add vs generic"});
  CodecSpeed generic;
  for (const std::string& path :
       {std::string("generic"), std::string("avx2"), std::string("avx512")}) {
    const auto have = codec_isas();
    if (std::find(have.begin(), have.end(), path) == have.end()) continue;
    set_codec_isa(path);
    const CodecSpeed s = codec_speed(x, y, 4);
    if (path == "generic") generic = s;
    p.add({path, fmt(s.encode), fmt(s.decode_add), fmt(s.encode / generic.encode) + "x",
           fmt(s.decode_add / generic.decode_add) + "x"});
  }
  set_codec_isa(best);
  std::printf(
      "\n4-bit codec per path (targets on the best path: encode >= 8, decode-add >= 12 GB/s):\n%s",
      p.str().c_str());
}

// ---------------------------------------------------------------- worker (one rank)

// The allreduce of 64 MiB of float32, plain and QSGD at 8, 4 and 2 bits, on the codec's
// best path and on the baseline (generic) one; for 4 bits also where the time went.
void time_allreduce(ProcessGroup& g) {
  using namespace lockstep::compress;
  const int64_t n = 16 << 20;
  at::Tensor t = at::randn({n});
  // At least 3 runs and 1 s, at most 5: rank 0's clock decides for every rank.
  const RunCount runs{.warmup = 1, .min_iters = 3, .max_iters = 5, .min_seconds = 1.0};
  t.fill_(1.0f);
  report_result(g.rank(), "allreduce_fp32",
                median(time_runs([&] { g.allreduce(t)->wait(); }, &g, runs)));
  const std::string best = codec_isa();
  for (const std::string& path : {best, std::string("generic")}) {
    set_codec_isa(path);
    const std::string suffix = path == best ? "" : "_generic";
    for (int bits : {8, 4, 2}) {
      if (!suffix.empty() && bits != 4) continue;
      QsgdOptions o;
      o.bits = bits;
      o.min_layer = 0;
      o.exclude = {};
      CompressedAllreduce plan(o, {{"w", 0, n}}, n, g.size());
      t.normal_();
      AllreduceStats st;
      const std::string key = "allreduce_q" + std::to_string(bits) + suffix;
      report_result(g.rank(), key, median(time_runs([&] { st = plan.run(g, t, true); }, &g, runs)));
      if (bits != 4) continue;
      const auto& s = st.seconds;  // the last run's phases
      for (const auto& [name, v] : {std::pair<const char*, double>{"encode", s.encode},
                                    {"alltoall", s.alltoall},
                                    {"reduce", s.reduce},
                                    {"reencode", s.reencode},
                                    {"allgather", s.allgather},
                                    {"decode", s.decode},
                                    {"wait", s.transfer_wait}})
        report_result(g.rank(), key + "." + name, v);
    }
  }
  set_codec_isa(best);
}

// The DDP step of the 21M-parameter MLP, batch 64 per rank, SGD; plain or the 4-bit hook.
void time_ddp_step(const std::shared_ptr<ProcessGroup>& g, bool hook, int steps) {
  torch::manual_seed(0);
  lockstep::models::Mlp model(std::vector<int64_t>{1024, 4096, 4096, 10});
  lockstep::ddp::DistributedDataParallel ddp(model, g);
  if (hook) {
    compress::QsgdOptions o;
    o.bits = 4;
    o.use_env = false;
    ddp.register_comm_hook(ddp::hooks::qsgd(o));
  }
  torch::optim::SGD opt(ddp.parameters(), 0.01);
  at::Tensor xb = torch::randn({64, 1024}), yb = torch::randint(0, 10, {64});
  auto step = [&] {
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(ddp(xb), yb);
    loss.backward();
    opt.step();
  };
  auto runs = time_runs(step, g.get(),
                        {.warmup = 2, .min_iters = steps, .max_iters = steps, .min_seconds = 0});
  report_result(g->rank(), hook ? "ddp_step_q4" : "ddp_step_fp32", median(runs));
}

int run_worker(const Options& o) {
  auto g = lockstep::init();
  time_allreduce(*g);
  if (!o.skip_ddp)
    for (bool hook : {false, true}) time_ddp_step(g, hook, o.steps);
  g->barrier()->wait();
  return 0;
}

// ---------------------------------------------------------------- driver

std::string g_netns;  // for the signal handler: remove the namespace on ctrl-C
void remove_netns() {
  if (!g_netns.empty()) {
    std::system(("ip netns del " + g_netns + " 2>/dev/null").c_str());
    g_netns.clear();
  }
}
extern "C" void on_signal(int sig) {
  remove_netns();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct NetnsGuard {  // removes the namespace on every exit path, exceptions included
  ~NetnsGuard() { remove_netns(); }
};

// Creates the namespace g_netns names, with its loopback up; false if not permitted.
bool create_netns() {
  g_netns = "lockstep-bench-" + std::to_string(getpid());
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (std::system(("ip netns add " + g_netns + " 2>/dev/null").c_str()) != 0 ||
      std::system(("ip netns exec " + g_netns + " ip link set lo up").c_str()) != 0) {
    g_netns.clear();
    return false;
  }
  return true;
}

using Results = std::map<std::string, double>;  // RESULT key -> seconds

// The worker job over loopback shaped to `rate`; empty if tc cannot shape it.
Results run_rate(const Options& o, const std::string& rate) {
  // burst must exceed the loopback MTU (64 KiB); 4 MiB keeps tbf accurate at 10 Gbit/s.
  const std::string tc = "ip netns exec " + g_netns + " tc qdisc replace dev lo root tbf rate " +
                         rate + " burst 4mb latency 100ms";
  if (std::system(tc.c_str()) != 0) {
    std::printf("tc tbf failed for %s; skipped\n", rate.c_str());
    return {};
  }
  std::printf("\n== loopback shaped to %s, %d ranks, gloo ==\n", rate.c_str(), o.nproc);
  return run_job("LOCKSTEP_BACKEND=gloo LOCKSTEP_TIMEOUT_S=600 ip netns exec " + g_netns +
                 " '" LOCKSTEP_RUN_PATH "' --nproc-per-node " + std::to_string(o.nproc) +
                 " --master-port 0 " + self_command() + " compression --worker --steps " +
                 std::to_string(o.steps) + (o.skip_ddp ? " --skip-ddp" : ""));
}

void print_thin_link_table(const std::vector<std::string>& rates,
                           std::map<std::string, Results>& all) {
  auto cell = [&](const std::string& rate, const std::string& k) {
    auto it = all[rate].find(k);
    return it == all[rate].end() ? std::string("n/a") : fmt(it->second * 1e3, 1);
  };
  auto ratio = [&](const std::string& rate, const std::string& base, const std::string& k) {
    auto& m = all[rate];
    return m.count(base) && m.count(k) ? fmt(m[base] / m[k]) + "x" : std::string("n/a");
  };
  Table t({"link", "what", "fp32 ms", "8-bit ms", "4-bit ms", "2-bit ms", "speedup 8/4/2"});
  for (const auto& rate : rates) {
    t.add({rate, "allreduce 64MiB", cell(rate, "allreduce_fp32"), cell(rate, "allreduce_q8"),
           cell(rate, "allreduce_q4"), cell(rate, "allreduce_q2"),
           ratio(rate, "allreduce_fp32", "allreduce_q8") + " / " +
               ratio(rate, "allreduce_fp32", "allreduce_q4") + " / " +
               ratio(rate, "allreduce_fp32", "allreduce_q2")});
    t.add({rate, "same, generic codec", "", "", cell(rate, "allreduce_q4_generic"), "",
           ratio(rate, "allreduce_fp32", "allreduce_q4_generic") + " (4-bit)"});
    t.add({rate, "DDP step MLP 21M", cell(rate, "ddp_step_fp32"), "", cell(rate, "ddp_step_q4"), "",
           ratio(rate, "ddp_step_fp32", "ddp_step_q4") + " (4-bit)"});
  }
  std::printf(
      "\ncompressed allreduce over thin links (median ms; targets: 4-bit allreduce >= 4x and "
      "DDP step >= 2x at 10gbit, 4-bit allreduce >= 2x at 25gbit, no regression at 1gbit):\n%s",
      t.str().c_str());
  // Where the 4-bit allreduce's time goes, rank 0, the last timed call. Codec phases run on
  // the helper thread while the transfers run (pipelined), so the columns overlap.
  Table p({"link", "codec", "total ms", "encode", "alltoall", "reduce", "reencode", "allgather",
           "decode", "transfers waiting for codec"});
  for (const auto& rate : rates) {
    for (const std::string suffix : {"", "_generic"}) {
      const std::string k = "allreduce_q4" + suffix;
      p.add({rate, suffix.empty() ? "best" : "generic", cell(rate, k), cell(rate, k + ".encode"),
             cell(rate, k + ".alltoall"), cell(rate, k + ".reduce"), cell(rate, k + ".reencode"),
             cell(rate, k + ".allgather"), cell(rate, k + ".decode"), cell(rate, k + ".wait")});
    }
  }
  std::printf("\n4-bit allreduce of 64 MiB, phases (ms):\n%s", p.str().c_str());
}

int run_driver(const Options& o) {
  codec_table();
  if (o.skip_net) return 0;
  NetnsGuard guard;
  if (!create_netns()) {
    std::printf(
        "\nthin-link runs skipped: creating a network namespace is not permitted here "
        "(needs root / CAP_NET_ADMIN and iproute2)\n");
    return 0;
  }
  const std::vector<std::string> rates = split_csv(o.rates);
  std::map<std::string, Results> all;
  for (const auto& rate : rates) all[rate] = run_rate(o, rate);
  print_thin_link_table(rates, all);
  return 0;
}

}  // namespace

Command compression_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app =
      bench.add_subcommand("compression",
                           "QSGD codec throughput, and the compressed allreduce and DDP step over "
                           "shaped loopback links, uncompressed vs QSGD");
  app->add_option("--nproc", o->nproc, "ranks")->check(CLI::PositiveNumber)->capture_default_str();
  app->add_option("--rates", o->rates, "link rates (tc tbf), comma-separated")
      ->capture_default_str();
  app->add_option("--steps", o->steps, "timed DDP steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--skip-net", o->skip_net, "only the codec table (no network namespace)");
  app->add_flag("--skip-ddp", o->skip_ddp, "thin links: time the allreduce, not the DDP step");
  app->add_flag("--worker", o->worker)->group(kWorkerOnly);
  return {app, [o] { return o->worker ? run_worker(*o) : run_driver(*o); }};
}

}  // namespace lockstep::bench
