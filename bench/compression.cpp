// lockstep-bench compression: codec throughput per bit width, and the compressed allreduce
// and DDP step over thin links (loopback shaped by tbf inside a private network namespace
// that this program creates and always removes), uncompressed vs QSGD, in one run.
//
//   lockstep-bench compression [--nproc 2] [--rates 1gbit,10gbit] [--skip-net] [--steps 5]
//
// The driver measures the codec itself, then for each rate runs
//   ip netns exec NS lockstep-run --nproc-per-node N --master-port 0 SELF compression --worker
// with LOCKSTEP_BACKEND=gloo; workers print "RESULT key seconds" lines on rank 0.
#include "bench_util.h"

#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/lockstep.h>
#include <lockstep/compress/ddp_hook.h>
#include <lockstep/ddp/ddp.h>
#include <lockstep/models/mlp.h>
#include <torch/torch.h>

#include <ATen/ATen.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <unistd.h>

namespace lockstep::bench {
namespace {

struct Args {
  bool worker = false, skip_net = false;
  int nproc = 2, steps = 5;
  std::string rates = "1gbit,10gbit";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--worker") a.worker = true;
    else if (k == "--skip-net") a.skip_net = true;
    else if (k == "--nproc") a.nproc = std::stoi(val());
    else if (k == "--steps") a.steps = std::stoi(val());
    else if (k == "--rates") a.rates = val();
    else throw std::invalid_argument("unknown option " + k +
        " (compression [--nproc N] [--rates 1gbit,10gbit] [--steps N] [--skip-net])");
  }
  return a;
}

double cpu_now() {  // this thread's CPU time: "per core" throughput, immune to other load
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

void codec_table() {
  using namespace lockstep::compress;
  const int64_t n = 16 << 20;  // 64 MiB of float32
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  std::mt19937 g(1);
  std::normal_distribution<float> d;
  for (auto& v : x) v = d(g);
  Table t({"bits", "encode GB/s", "decode GB/s", "enc+dec GB/s", "ratio vs fp32", "max err/unit"});
  for (int bits = 1; bits <= 8; ++bits) {
    CodecOptions o{bits, 128, true};
    std::vector<uint8_t> buf(size_t(encoded_bytes(n, o)));
    std::vector<double> te, td;
    for (int r = 0; r < 5; ++r) {
      const double t0 = cpu_now();
      encode(x.data(), n, o, StreamKey{1, uint64_t(r), 0, 1}, 0, buf.data());
      const double t1 = cpu_now();
      decode(buf.data(), n, o, y.data());
      const double t2 = cpu_now();
      te.push_back(t1 - t0);
      td.push_back(t2 - t1);
    }
    double worst = 0;  // verification: |err| < unit in every bucket
    for (int64_t b = 0; b < n; b += 128) {
      float lo = x[size_t(b)], hi = lo;
      for (int64_t i = b; i < b + 128; ++i) lo = std::min(lo, x[size_t(i)]), hi = std::max(hi, x[size_t(i)]);
      const double unit = unit_for(lo, hi, bits);
      for (int64_t i = b; i < b + 128; ++i)
        worst = std::max(worst, std::fabs(double(y[size_t(i)]) - x[size_t(i)]) / unit);
    }
    const double gb = double(n) * 4 / 1e9, e = median(te), dd = median(td);
    t.add({std::to_string(bits), fmt(gb / e), fmt(gb / dd), fmt(gb / (e + dd)),
           fmt(double(n) * 4 / double(buf.size()), 1) + "x", fmt(worst, 3)});
  }
  std::printf("QSGD codec, float32, bucket 128, stochastic rounding, 1 core (thread CPU time, median of 5):\n%s",
              t.str().c_str());
}

// ---------------------------------------------------------------- worker (one rank)

void result(int rank, const std::string& key, double v) {
  if (rank == 0) std::printf("RESULT %s %.6f\n", key.c_str(), v);
  std::fflush(stdout);
}

int run_worker(const Args& a) {
  using namespace lockstep::compress;
  auto g = lockstep::init();
  const int P = g->size(), me = g->rank();
  const int64_t n = 16 << 20;  // 64 MiB float32
  at::Tensor t = at::randn({n});
  auto sync = [&] { g->barrier()->wait(); };
  t.fill_(1.0f);
  auto plain = time_runs([&] { g->allreduce(t)->wait(); }, sync, 1, 3, 5, 1.0);
  result(me, "allreduce_fp32", median(plain));
  for (int bits : {8, 4, 2}) {
    QsgdOptions o;
    o.bits = bits;
    o.min_layer = 0;
    o.exclude = {};
    CompressedAllreduce plan(o, {{"w", 0, n}}, n, P);
    t.normal_();
    auto runs = time_runs([&] { plan.run(*g, t, true); }, sync, 1, 3, 5, 1.0);
    result(me, "allreduce_q" + std::to_string(bits), median(runs));
  }
  // DDP step of the 21M-parameter MLP, batch 64 per rank, SGD; plain vs the 4-bit hook.
  for (int hook = 0; hook < 2; ++hook) {
    torch::manual_seed(0);
    lockstep::models::Mlp model(std::vector<int64_t>{1024, 4096, 4096, 10});
    lockstep::ddp::DistributedDataParallel ddp(model, g);
    if (hook) {
      QsgdOptions o;
      o.bits = 4;
      o.use_env = false;
      ddp.register_comm_hook(qsgd(o));
    }
    torch::optim::SGD opt(ddp.parameters(), 0.01);
    at::Tensor xb = torch::randn({64, 1024}), yb = torch::randint(0, 10, {64});
    auto step = [&] {
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(ddp(xb), yb);
      loss.backward();
      opt.step();
    };
    auto runs = time_runs(step, sync, 2, a.steps, a.steps, 0.0);
    result(me, hook ? "ddp_step_q4" : "ddp_step_fp32", median(runs));
  }
  g->barrier()->wait();
  return 0;
}

// ---------------------------------------------------------------- driver

std::string self_exe() {
  char buf[4096];
  ssize_t k = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return k > 0 ? std::string(buf, size_t(k)) : "lockstep-bench";
}

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

std::map<std::string, double> run_job(const std::string& cmd) {
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  std::map<std::string, double> r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    char key[128];
    double v;
    // lockstep-run prefixes worker lines with "[rank N] ".
    const char* l = line;
    if (l[0] == '[') {
      const char* e = std::strchr(l, ']');
      if (e) l = e + (e[1] == ' ' ? 2 : 1);
    }
    if (std::sscanf(l, "RESULT %127s %lf", key, &v) == 2) r[key] = v;
    else std::fputs(line, stdout);
  }
  if (pclose(p) != 0) std::fprintf(stderr, "worker job failed: %s\n", cmd.c_str());
  return r;
}

int run_driver(const Args& a) {
  codec_table();
  if (a.skip_net) return 0;
  g_netns = "lockstep-bench-" + std::to_string(getpid());
  NetnsGuard guard;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  if (std::system(("ip netns add " + g_netns + " 2>/dev/null").c_str()) != 0 ||
      std::system(("ip netns exec " + g_netns + " ip link set lo up").c_str()) != 0) {
    g_netns.clear();
    std::printf("\nthin-link runs skipped: creating a network namespace is not permitted here "
                "(needs root / CAP_NET_ADMIN and iproute2)\n");
    return 0;
  }
  std::map<std::string, std::map<std::string, double>> all;
  std::vector<std::string> rates;
  for (size_t s = 0, e; s < a.rates.size(); s = e + 1) {
    e = a.rates.find(',', s);
    if (e == std::string::npos) e = a.rates.size();
    rates.push_back(a.rates.substr(s, e - s));
  }
  for (const auto& rate : rates) {
    // burst must exceed the loopback MTU (64 KiB); 4 MiB keeps tbf accurate at 10 Gbit/s.
    const std::string tc = "ip netns exec " + g_netns + " tc qdisc replace dev lo root tbf rate " +
                           rate + " burst 4mb latency 100ms";
    if (std::system(tc.c_str()) != 0) {
      std::printf("tc tbf failed for %s; skipped\n", rate.c_str());
      continue;
    }
    std::printf("\n== loopback shaped to %s, %d ranks, gloo ==\n", rate.c_str(), a.nproc);
    all[rate] = run_job("LOCKSTEP_BACKEND=gloo LOCKSTEP_TIMEOUT_S=600 ip netns exec " + g_netns +
                        " '" LOCKSTEP_RUN_PATH "' --nproc-per-node " + std::to_string(a.nproc) +
                        " --master-port 0 '" + self_exe() + "' compression --worker --steps " +
                        std::to_string(a.steps) + " 2>&1");
  }
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
    t.add({rate, "DDP step MLP 21M", cell(rate, "ddp_step_fp32"), "", cell(rate, "ddp_step_q4"), "",
           ratio(rate, "ddp_step_fp32", "ddp_step_q4") + " (4-bit)"});
  }
  std::printf("\ncompressed allreduce over thin links (median ms; targets at 1gbit: 4-bit allreduce "
              ">= 4x, DDP step >= 2.5x):\n%s", t.str().c_str());
  return 0;
}

}  // namespace

int compression_main(int argc, char** argv) {
  Args a = parse(argc, argv);
  return a.worker ? run_worker(a) : run_driver(a);
}

}  // namespace lockstep::bench
