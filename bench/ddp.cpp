// lockstep-bench ddp: the DDP training step of lockstep beside PyTorch's own Python DDP
// (over Gloo), same model and data, measured in one run.
//
//   lockstep-bench ddp [--nproc 1,2] [--configs shm,gloo,mpi] [--steps 30] [--warmup 5]
//                      [--rounds 1] [--out bench-results/ddp.csv] [--skip-peer]
//                      [--python /usr/bin/python3] [--profile]
//
// Workload (both sides): Mlp 1024-4096-4096-10 (~21M parameters, 84 MB of float32
// gradients), batch 64 per rank, SGD lr 0.01, one compute thread per rank
// (at::set_num_threads(1), OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1), DDP defaults
// (25 MiB buckets, 1 MiB first bucket, grads reduced in place), synthetic data
// from fixed seeds (model seed 0, data seed 1000 + rank).
//
// The driver runs, per round, every (ranks, config) as its own job:
//   lockstep-run --nproc-per-node N SELF ddp --worker --backend shm|gloo
//   scripts/mpirun.sh -np N SELF ddp --worker --backend mpi
//   N x  RANK=r WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=p python3 bench/peers/pytorch_ddp.py
// Workers print "RESULT key seconds" lines on rank 0 (see bench/ddp_worker.cpp); the
// driver takes the median over rounds, prints one table with the peer beside us and the
// ratio, and writes the CSV. A config "shm:view" runs shm with gradient_as_bucket_view,
// "shm:private" with DDPOptions::shared_buckets off (buckets in private memory).
#include "bench_util.h"
#include "ddp_bench.h"

#include <lockstep/launch/rank_env.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <netinet/in.h>
#include <sstream>
#include <stdexcept>
#include <sys/socket.h>
#include <unistd.h>

namespace lockstep::bench {
namespace {

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  for (size_t b = 0, e; b <= s.size(); b = e + 1) {
    e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
  }
  return out;
}

DdpArgs parse(int argc, char** argv) {
  DdpArgs a;
  for (int i = 0; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--worker") a.worker = true;
    else if (k == "--backend") a.backend = val();
    else if (k == "--view") a.view = true;
    else if (k == "--private") a.private_buckets = true;
    else if (k == "--profile") a.profile = true;
    else if (k == "--skip-peer") a.skip_peer = true;
    else if (k == "--nproc") a.nprocs = val();
    else if (k == "--configs") a.configs = val();
    else if (k == "--steps") a.steps = std::stoi(val());
    else if (k == "--warmup") a.warmup = std::stoi(val());
    else if (k == "--rounds") a.rounds = std::stoi(val());
    else if (k == "--batch") a.batch = std::stoi(val());
    else if (k == "--out") a.out = val();
    else if (k == "--python") a.python = val();
    else if (k == "--peer-script") a.peer_script = val();
    else throw std::invalid_argument(
        "unknown option " + k +
        " (ddp [--nproc 1,2] [--configs shm,gloo,mpi,shm:view,shm:private] [--steps N] [--warmup N] "
        "[--rounds N] [--out FILE] [--skip-peer] [--python PATH] [--profile])");
  }
  return a;
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "lockstep-bench";
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  int port = 29511;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

// Runs a shell command; returns its RESULT lines, echoes everything else.
std::map<std::string, double> run_job(const std::string& cmd) {
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  std::map<std::string, double> r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char line[1024];
  while (std::fgets(line, sizeof line, p)) {
    char key[128];
    double v;
    const char* at = std::strstr(line, "RESULT ");  // lockstep-run prefixes "[rank 0] "
    if (at && std::sscanf(at, "RESULT %127s %lf", key, &v) == 2) r[key] = v;
    else std::fputs(line, stdout);
  }
  if (pclose(p) != 0) std::fprintf(stderr, "job failed: %s\n", cmd.c_str());
  return r;
}

// Every side runs with the same environment: one compute thread, and glibc malloc as
// lockstep-run sets it up (large tensors stay in the heap; see docs/launcher.md).
std::string rank_env_prefix() {
  std::string env = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 ";
  for (const auto& [k, v] : launch::malloc_defaults({})) env += k + "=" + v + " ";
  return env;
}
const std::string kRankEnv = rank_env_prefix();

std::string worker_flags(const DdpArgs& a) {
  return " ddp --worker --steps " + std::to_string(a.steps) + " --warmup " +
         std::to_string(a.warmup) + " --batch " + std::to_string(a.batch) +
         (a.profile ? " --profile" : "");
}

std::string lockstep_cmd(const DdpArgs& a, const std::string& config, int n) {
  const size_t colon = config.find(':');
  const std::string backend = config.substr(0, colon);
  const std::string variant = colon == std::string::npos ? "" : config.substr(colon + 1);
  const std::string self = "'" + self_exe() + "'";
  const std::string flags = worker_flags(a) + " --backend " + backend +
                            (variant.empty() ? "" : " --" + variant);
  if (backend == "mpi")
    return kRankEnv + "'" LOCKSTEP_MPIRUN_PATH "' -np " + std::to_string(n) +
           " " + self + flags;
  return kRankEnv + "LOCKSTEP_BACKEND=" + backend + " '" LOCKSTEP_RUN_PATH
         "' --nproc-per-node " + std::to_string(n) + " --master-port 0 " + self + flags;
}

std::string peer_script(const DdpArgs& a) {
  if (!a.peer_script.empty()) return a.peer_script;
  std::string mpirun = LOCKSTEP_MPIRUN_PATH;  // <source>/scripts/mpirun.sh
  return mpirun.substr(0, mpirun.rfind("/scripts/")) + "/bench/peers/pytorch_ddp.py";
}

// N background processes with the torchrun environment contract; rank 0 in front.
std::string peer_cmd(const DdpArgs& a, int n) {
  const std::string port = std::to_string(free_port());
  const std::string args = " '" + peer_script(a) + "' --steps " + std::to_string(a.steps) +
                           " --warmup " + std::to_string(a.warmup) + " --batch " +
                           std::to_string(a.batch);
  std::string cmd = "(";
  for (int r = n - 1; r >= 0; --r) {
    cmd += kRankEnv + "RANK=" + std::to_string(r) + " WORLD_SIZE=" +
           std::to_string(n) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " '" + a.python +
           "'" + args + (r ? " >/dev/null & " : "; wait)");
  }
  return cmd;
}

using Result = std::map<std::string, double>;

// Median over rounds, key by key.
Result combine(const std::vector<Result>& rounds) {
  std::map<std::string, std::vector<double>> all;
  for (const auto& r : rounds)
    for (const auto& [k, v] : r) all[k].push_back(v);
  Result out;
  for (auto& [k, v] : all) out[k] = median(v);
  return out;
}

int run_driver(const DdpArgs& a) {
  const auto nprocs = split_csv(a.nprocs);
  const auto configs = split_csv(a.configs);
  for (const auto& c : configs) {
    const std::string b = c.substr(0, c.find(':')), v = c.substr(std::min(c.size(), b.size() + 1));
    if ((b != "shm" && b != "gloo" && b != "mpi") || (v != "" && v != "view" && v != "private"))
      throw lockstep::ConfigError("ddp: unknown config '" + c + "' (a backend shm, gloo or mpi, "
                                  "optionally with :view or :private)");
  }
  if (auto slash = a.out.rfind('/'); slash != std::string::npos)
    std::system(("mkdir -p '" + a.out.substr(0, slash) + "'").c_str());
  const std::string load_before = loadavg();
  std::printf("lockstep-bench ddp: Mlp 1024-4096-4096-10, batch %d per rank, SGD, 1 compute "
              "thread per rank, %d warm-up + %d timed steps, %d round(s)\n"
              "load average before: %s  (cores: %ld)\n",
              a.batch, a.warmup, a.steps, a.rounds, load_before.c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  std::map<std::string, std::vector<Result>> raw;  // "impl|ranks"
  for (int round = 0; round < a.rounds; ++round) {
    for (const auto& ns : nprocs) {
      const int n = std::stoi(ns);
      for (const auto& c : configs) {
#ifndef LOCKSTEP_HAVE_MPI
        if (c.rfind("mpi", 0) == 0) continue;
#endif
        std::printf("\n== round %d: lockstep %s, %d rank(s)  [load %s]\n", round + 1, c.c_str(), n,
                    loadavg().c_str());
        auto r = run_job(lockstep_cmd(a, c, n));
        if (!r.empty()) raw[c + "|" + ns].push_back(r);
      }
      if (!a.skip_peer) {
        std::printf("\n== round %d: PyTorch DDP (gloo), %d rank(s)  [load %s]\n", round + 1, n,
                    loadavg().c_str());
        auto r = run_job(peer_cmd(a, n));
        if (!r.empty()) raw["pytorch|" + ns].push_back(r);
      }
    }
  }
  const std::string load_after = loadavg();
  std::map<std::string, Result> res;
  for (auto& [k, v] : raw) res[k] = combine(v);
  auto get = [&](const std::string& impl, const std::string& ns) -> const Result* {
    auto it = res.find(impl + "|" + ns);
    return it == res.end() || !it->second.count("step") ? nullptr : &it->second;
  };
  auto val = [](const Result* r, const char* k) {
    return r && r->count(k) ? r->at(k) : -1.0;
  };
  auto ms = [&](const Result* r, const char* k) {
    const double v = val(r, k);
    return v < 0 ? std::string("n/a") : fmt(v * 1e3, 1);
  };
  auto tput = [&](const Result* r, int n) { return r ? a.batch * n / r->at("step") : -1.0; };
  auto num = [](double v, int d, const char* suffix = "") {
    return v < 0 ? std::string("n/a") : fmt(v, d) + suffix;
  };
  // Exposed communication: lockstep measures it (StepStats::exposed_comm_s); for PyTorch it
  // is estimated as backward with sync minus backward under no_sync.
  auto exposed = [&](const Result* r) {
    if (!r) return -1.0;
    if (r->count("exposed_comm")) return r->at("exposed_comm");
    if (r->count("backward_nosync")) return std::max(0.0, r->at("backward") - r->at("backward_nosync"));
    return -1.0;
  };
  auto share = [&](const Result* r) {
    const double e = exposed(r);
    return e < 0 ? -1.0 : 100.0 * e / r->at("step");
  };

  std::ofstream csv(a.out);
  csv << "impl,config,ranks,step_s,forward_s,backward_s,optimizer_s,exposed_comm_s,"
         "exposed_share,samples_per_s,scaling,step_ratio_vs_pytorch,backward_nosync_s,rounds,"
         "load_before,load_after\n";
  Table t({"config", "ranks", "step ms", "fwd/bwd/opt ms", "samples/s", "scaling", "exposed",
           "PyTorch step ms", "PyTorch samples/s", "PyTorch scaling", "PyTorch exposed*",
           "step lockstep/PyTorch"});
  const std::string n1 = nprocs.empty() ? "1" : nprocs.front();
  for (const auto& c : configs) {
    for (const auto& ns : nprocs) {
      const int n = std::stoi(ns);
      const Result* r = get(c, ns);
      const Result* p = get("pytorch", ns);
      const Result* r1 = get(c, n1);
      const Result* p1 = get("pytorch", n1);
      const double sc = r && r1 ? tput(r, n) / tput(r1, std::stoi(n1)) : -1;
      const double psc = p && p1 ? tput(p, n) / tput(p1, std::stoi(n1)) : -1;
      const double ratio = r && p ? r->at("step") / p->at("step") : -1;
      t.add({c, ns, ms(r, "step"),
             ms(r, "forward") + "/" + ms(r, "backward") + "/" + ms(r, "optimizer"),
             num(tput(r, n), 0), num(sc, 2, "x"), num(share(r), 0, "%"), ms(p, "step"),
             num(tput(p, n), 0), num(psc, 2, "x"), num(share(p), 0, "%"), num(ratio, 2, "x")});
      if (r)
        csv << "lockstep," << c << "," << n << "," << r->at("step") << "," << val(r, "forward")
            << "," << val(r, "backward") << "," << val(r, "optimizer") << "," << exposed(r) << ","
            << share(r) / 100 << "," << tput(r, n) << "," << sc << "," << ratio << ","
            << val(r, "backward_nosync") << "," << raw[c + "|" + ns].size() << "," << load_before
            << "," << load_after << "\n";
    }
  }
  for (const auto& ns : nprocs) {
    const int n = std::stoi(ns);
    const Result* p = get("pytorch", ns);
    const Result* p1 = get("pytorch", n1);
    if (!p) continue;
    const double psc = p1 ? tput(p, n) / tput(p1, std::stoi(n1)) : -1;
    csv << "pytorch,gloo," << n << "," << p->at("step") << "," << val(p, "forward") << ","
        << val(p, "backward") << "," << val(p, "optimizer") << "," << exposed(p) << ","
        << share(p) / 100 << "," << tput(p, n) << "," << psc << ",1," << val(p, "backward_nosync")
        << "," << raw["pytorch|" + ns].size() << "," << load_before << "," << load_after << "\n";
  }
  std::printf("\nDDP training step, median of %d steps (median over %d round(s)); load average "
              "before %s, after %s\n%s"
              "exposed = StepStats::exposed_comm_s / step; *PyTorch: (backward - backward under "
              "no_sync) / step, an estimate\n",
              a.steps, a.rounds, load_before.c_str(), load_after.c_str(), t.str().c_str());

  // Breakdown of lockstep's step (rank 0) for the profile.
  Table b({"config", "ranks", "forward", "backward", "  of which hook->end", "  exposed wait",
           "  finalize", "backward no_sync", "optimizer", "buckets", "verified"});
  for (const auto& c : configs)
    for (const auto& ns : nprocs)
      if (const Result* r = get(c, ns))
        b.add({c, ns, ms(r, "forward"), ms(r, "backward"), ms(r, "hook_backward"),
               ms(r, "exposed_comm"), ms(r, "finalize"), ms(r, "backward_nosync"),
               ms(r, "optimizer"), num(val(r, "buckets"), 0), val(r, "verified") == 1 ? "yes" : "NO"});
  for (const auto& ns : nprocs)
    if (const Result* p = get("pytorch", ns))
      b.add({"PyTorch", ns, ms(p, "forward"), ms(p, "backward"), "", "", "",
             ms(p, "backward_nosync"), ms(p, "optimizer"), "", val(p, "verified") == 1 ? "yes" : "NO"});
  std::printf("\nwhere the time goes (ms, rank 0, medians):\n%s", b.str().c_str());

  if (a.profile) {
    Table pt({"config", "ranks", "allreduce 84MB", "allreduce per bucket (sum)",
              "copy+scale 84MB", "copy 84MB", "zero_grad", "SGD step", "fc1 dW alone",
              "fc1 dW during allreduce"});
    for (const auto& c : configs)
      for (const auto& ns : nprocs)
        if (const Result* r = get(c, ns); r && r->count("prof_allreduce_all"))
          pt.add({c, ns, ms(r, "prof_allreduce_all"), ms(r, "prof_allreduce_buckets"),
                  ms(r, "prof_mul_out"), ms(r, "prof_copy"), ms(r, "prof_zero_grad"),
                  ms(r, "prof_sgd"), ms(r, "prof_fc1_dw"), ms(r, "prof_fc1_dw_overlap")});
    std::printf("\nprofile: component costs measured in isolation (ms, rank 0, medians; every "
                "rank runs them at once):\n%s", pt.str().c_str());
  }

  // The targets, for the shm backend (the default on one node).
  if (const Result* r2 = get("shm", "2"); r2 && get("shm", "1")) {
    const double sc = tput(r2, 2) / tput(get("shm", "1"), 1);
    std::printf("\ntarget scaling >= 1.70x (shm): %.2fx  %s\n", sc, sc >= 1.7 ? "MET" : "MISSED");
    if (const Result* p2 = get("pytorch", "2")) {
      const double ratio = r2->at("step") / p2->at("step");
      std::printf("target 2-rank step <= 0.75x PyTorch DDP (shm): %.2fx  %s\n", ratio,
                  ratio <= 0.75 ? "MET" : "MISSED");
    }
  }
  std::printf("CSV: %s\n", a.out.c_str());
  return 0;
}

}  // namespace

int ddp_main(int argc, char** argv) {
  DdpArgs a = parse(argc, argv);
  return a.worker ? ddp_worker(a) : run_driver(a);
}

}  // namespace lockstep::bench
