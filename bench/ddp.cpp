// lockstep-bench ddp: the DDP training step of lockstep beside PyTorch's own Python DDP
// (over Gloo), same model and data, measured in one run.
//
//   lockstep-bench ddp [--nproc 1,2] [--configs shm,gloo,mpi] [--steps 30] [--warmup 5]
//                      [--rounds 1] [--out bench-results/ddp.csv] [--skip-peer]
//                      [--python /usr/bin/python3] [--profile] [--bf16]
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
//   scripts/mpirun.sh -np N SELF ddp --worker --backend auto    (config "mpirun": no
//     LOCKSTEP_BACKEND, so shm on one node over a store bootstrapped through MPI)
//   N x  RANK=r WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=p python3 bench/peers/pytorch_ddp.py
// Workers print "RESULT key seconds" lines on rank 0 (see bench/ddp_worker.cpp); the
// driver takes the median over rounds, prints one table with the peer beside us and the
// ratio, and writes the CSV. A config "shm:view" runs shm with gradient_as_bucket_view,
// "shm:private" with DDPOptions::shared_buckets off (buckets in private memory).
#include "bench_util.h"
#include "commands.h"
#include "ddp_bench.h"
#include "jobs.h"

#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>

namespace lockstep::bench {
namespace {

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

// ---------------------------------------------------------------- the jobs

// Every side runs with the same environment (rank_environment()): one compute thread, and
// glibc malloc and OpenBLAS's kernels as lockstep-run sets them up (docs/launcher.md).

std::string worker_flags(const DdpArgs& a) {
  return " ddp --worker --steps " + std::to_string(a.steps) + " --warmup " +
         std::to_string(a.warmup) + " --batch " + std::to_string(a.batch) +
         (a.profile ? " --profile" : "") + (a.bf16 ? " --bf16" : "");
}

std::string lockstep_cmd(const DdpArgs& a, const std::string& config, int n) {
  const size_t colon = config.find(':');
  const std::string backend = config.substr(0, colon);
  const std::string variant = colon == std::string::npos ? "" : config.substr(colon + 1);
  const bool auto_mpirun = backend == "mpirun";
  const std::string flags = worker_flags(a) + " --backend " + (auto_mpirun ? "auto" : backend) +
                            (variant.empty() ? "" : " --" + variant);
  if (auto_mpirun)
    return rank_environment() +
           "env -u LOCKSTEP_BACKEND -u MASTER_PORT '" LOCKSTEP_MPIRUN_PATH "' -np " +
           std::to_string(n) + " " + self_command() + flags;
  if (backend == "mpi")
    return rank_environment() + "'" LOCKSTEP_MPIRUN_PATH "' -np " + std::to_string(n) + " " +
           self_command() + flags;
  return rank_environment() + "LOCKSTEP_BACKEND=" + backend +
         " '" LOCKSTEP_RUN_PATH "' --nproc-per-node " + std::to_string(n) + " --master-port 0 " +
         self_command() + flags;
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
                           std::to_string(a.batch) + (a.bf16 ? " --bf16" : "");
  std::string cmd = "(";
  for (int r = n - 1; r >= 0; --r) {
    cmd.append(rank_environment()).append("RANK=").append(std::to_string(r));
    cmd.append(" WORLD_SIZE=").append(std::to_string(n));
    cmd.append(" MASTER_ADDR=127.0.0.1 MASTER_PORT=").append(port);
    cmd.append(" '").append(a.python).append("'").append(args);
    cmd.append(r ? " >/dev/null & " : "; wait)");
  }
  return cmd;
}

using Result = std::map<std::string, double>;                   // RESULT key -> value
using RawResults = std::map<std::string, std::vector<Result>>;  // "impl|ranks" -> per round
std::string result_key(const std::string& impl, const std::string& ns) { return impl + "|" + ns; }

// Every round runs every (ranks, config) and the peer as its own job.
RawResults run_rounds(const DdpArgs& a) {
  RawResults raw;
  auto run = [&](const std::string& key, const std::string& what, int round, int n,
                 const std::string& cmd) {
    std::printf("\n== round %d: %s, %d rank(s)  [load %s]\n", round + 1, what.c_str(), n,
                loadavg().c_str());
    auto r = run_job(cmd);
    if (!r.empty()) raw[key].push_back(r);
  };
  for (int round = 0; round < a.rounds; ++round) {
    for (const auto& ns : split_csv(a.nprocs)) {
      const int n = std::stoi(ns);
      for (const auto& c : split_csv(a.configs)) {
#ifndef LOCKSTEP_HAVE_MPI
        if (c.rfind("mpi", 0) == 0) continue;
#endif
        run(result_key(c, ns), "lockstep " + c, round, n, lockstep_cmd(a, c, n));
      }
      if (!a.skip_peer)
        run(result_key("pytorch", ns), "PyTorch DDP (gloo)", round, n, peer_cmd(a, n));
    }
  }
  return raw;
}

// ---------------------------------------------------------------- the report

double val(const Result* r, const char* k) { return r && r->count(k) ? r->at(k) : -1.0; }
std::string ms(const Result* r, const char* k) {
  const double v = val(r, k);
  return v < 0 ? std::string("n/a") : fmt(v * 1e3, 1);
}
std::string num(double v, int d, const char* suffix = "") {
  return v < 0 ? std::string("n/a") : fmt(v, d) + suffix;
}
// Exposed communication: lockstep measures it (StepStats::exposed_comm_s); for PyTorch it
// is estimated as backward with sync minus backward under no_sync.
double exposed(const Result* r) {
  if (!r) return -1.0;
  if (r->count("exposed_comm")) return r->at("exposed_comm");
  if (r->count("backward_nosync"))
    return std::max(0.0, r->at("backward") - r->at("backward_nosync"));
  return -1.0;
}
double share(const Result* r) {
  const double e = exposed(r);
  return e < 0 ? -1.0 : 100.0 * e / r->at("step");
}
std::string verified(const Result* r) { return val(r, "verified") == 1 ? "yes" : "NO"; }

// The medians over rounds of every job and what is derived from them.
struct Report {
  Report(const DdpArgs& args, RawResults raw_results, std::string load)
      : a(args),
        nprocs(split_csv(args.nprocs)),
        configs(split_csv(args.configs)),
        raw(std::move(raw_results)),
        load_before(std::move(load)),
        load_after(loadavg()) {
    for (auto& [k, rounds] : raw) {  // median over rounds, key by key
      std::map<std::string, std::vector<double>> all;
      for (const auto& r : rounds)
        for (const auto& [key, v] : r) all[key].push_back(v);
      for (auto& [key, v] : all) medians[k][key] = median(v);
    }
  }
  // The medians of `impl` (a config or "pytorch") at `ns` ranks; nullptr if it has no step.
  const Result* get(const std::string& impl, const std::string& ns) const {
    auto it = medians.find(result_key(impl, ns));
    return it == medians.end() || !it->second.count("step") ? nullptr : &it->second;
  }
  size_t rounds(const std::string& impl, const std::string& ns) const {
    auto it = raw.find(result_key(impl, ns));
    return it == raw.end() ? 0 : it->second.size();
  }
  // Samples per second of all `n` ranks.
  double tput(const Result* r, int n) const { return r ? a.batch * n / r->at("step") : -1.0; }
  // Throughput at `ns` ranks over that at the first rank count.
  double scaling(const std::string& impl, const std::string& ns) const {
    const std::string n1 = nprocs.empty() ? "1" : nprocs.front();
    const Result *r = get(impl, ns), *r1 = get(impl, n1);
    return r && r1 ? tput(r, std::stoi(ns)) / tput(r1, std::stoi(n1)) : -1;
  }
  double step_ratio_vs_pytorch(const std::string& config, const std::string& ns) const {
    const Result *r = get(config, ns), *p = get("pytorch", ns);
    return r && p ? r->at("step") / p->at("step") : -1;
  }

  const DdpArgs& a;
  const std::vector<std::string> nprocs, configs;
  const RawResults raw;
  std::map<std::string, Result> medians;  // "impl|ranks" -> median over rounds
  const std::string load_before, load_after;
};

void write_csv(const Report& rep, const std::string& path) {
  std::ofstream csv(path);
  csv << "impl,config,ranks,step_s,forward_s,backward_s,optimizer_s,exposed_comm_s,"
         "exposed_share,samples_per_s,scaling,step_ratio_vs_pytorch,backward_nosync_s,rounds,"
         "load_before,load_after\n";
  auto row = [&](const std::string& columns, const std::string& impl, const std::string& ns,
                 const Result* r, double ratio) {
    const int n = std::stoi(ns);
    csv << columns << "," << n << "," << r->at("step") << "," << val(r, "forward") << ","
        << val(r, "backward") << "," << val(r, "optimizer") << "," << exposed(r) << ","
        << share(r) / 100 << "," << rep.tput(r, n) << "," << rep.scaling(impl, ns) << "," << ratio
        << "," << val(r, "backward_nosync") << "," << rep.rounds(impl, ns) << "," << rep.load_before
        << "," << rep.load_after << "\n";
  };
  for (const auto& c : rep.configs)
    for (const auto& ns : rep.nprocs)
      if (const Result* r = rep.get(c, ns))
        row("lockstep," + c, c, ns, r, rep.step_ratio_vs_pytorch(c, ns));
  for (const auto& ns : rep.nprocs)
    if (const Result* p = rep.get("pytorch", ns)) row("pytorch,gloo", "pytorch", ns, p, 1);
}

// lockstep's step beside PyTorch's, per config and rank count.
void print_step_table(const Report& rep) {
  Table t({"config", "ranks", "step ms", "fwd/bwd/opt ms", "samples/s", "scaling", "exposed",
           "PyTorch step ms", "PyTorch samples/s", "PyTorch scaling", "PyTorch exposed*",
           "step lockstep/PyTorch"});
  for (const auto& c : rep.configs) {
    for (const auto& ns : rep.nprocs) {
      const int n = std::stoi(ns);
      const Result* r = rep.get(c, ns);
      const Result* p = rep.get("pytorch", ns);
      t.add({c, ns, ms(r, "step"),
             ms(r, "forward") + "/" + ms(r, "backward") + "/" + ms(r, "optimizer"),
             num(rep.tput(r, n), 0), num(rep.scaling(c, ns), 2, "x"), num(share(r), 0, "%"),
             ms(p, "step"), num(rep.tput(p, n), 0), num(rep.scaling("pytorch", ns), 2, "x"),
             num(share(p), 0, "%"), num(rep.step_ratio_vs_pytorch(c, ns), 2, "x")});
    }
  }
  std::printf(
      "\nDDP training step, median of %d steps (median over %d round(s)); load average "
      "before %s, after %s\n%s"
      "exposed = StepStats::exposed_comm_s / step; *PyTorch: (backward - backward under "
      "no_sync) / step, an estimate\n",
      rep.a.steps, rep.a.rounds, rep.load_before.c_str(), rep.load_after.c_str(), t.str().c_str());
}

// Breakdown of lockstep's step (rank 0) for the profile.
void print_breakdown(const Report& rep) {
  Table b({"config", "ranks", "forward", "backward", "  of which hook->end", "  exposed wait",
           "  finalize", "backward no_sync", "optimizer", "buckets", "verified"});
  for (const auto& c : rep.configs)
    for (const auto& ns : rep.nprocs)
      if (const Result* r = rep.get(c, ns))
        b.add({c, ns, ms(r, "forward"), ms(r, "backward"), ms(r, "hook_backward"),
               ms(r, "exposed_comm"), ms(r, "finalize"), ms(r, "backward_nosync"),
               ms(r, "optimizer"), num(val(r, "buckets"), 0), verified(r)});
  for (const auto& ns : rep.nprocs)
    if (const Result* p = rep.get("pytorch", ns))
      b.add({"PyTorch", ns, ms(p, "forward"), ms(p, "backward"), "", "", "",
             ms(p, "backward_nosync"), ms(p, "optimizer"), "", verified(p)});
  std::printf("\nwhere the time goes (ms, rank 0, medians):\n%s", b.str().c_str());
}

// --profile: the step's components timed in isolation.
void print_profile(const Report& rep) {
  Table pt({"config", "ranks", "allreduce 84MB", "per bucket (sum)", "DDP's buckets in place",
            "copy+scale 84MB", "copy 84MB", "zero_grad", "SGD step", "fc1 dW alone",
            "fc1 dW during allreduce"});
  for (const auto& c : rep.configs)
    for (const auto& ns : rep.nprocs)
      if (const Result* r = rep.get(c, ns); r && r->count("prof_allreduce_all"))
        pt.add({c, ns, ms(r, "prof_allreduce_all"), ms(r, "prof_allreduce_buckets"),
                ms(r, "prof_allreduce_in_place"), ms(r, "prof_mul_out"), ms(r, "prof_copy"),
                ms(r, "prof_zero_grad"), ms(r, "prof_sgd"), ms(r, "prof_fc1_dw"),
                ms(r, "prof_fc1_dw_overlap")});
  std::printf(
      "\nprofile: component costs measured in isolation (ms, rank 0, medians; every "
      "rank runs them at once; the first two allreduces on private tensors):\n%s",
      pt.str().c_str());
}

// The targets, for the shm backend (the default on one node).
void print_targets(const Report& rep) {
  const Result* r2 = rep.get("shm", "2");
  if (const Result* m2 = rep.get("mpirun", "2"); m2 && r2) {
    const double ratio = m2->at("step") / r2->at("step");
    std::printf(
        "\ntarget 2-rank step under mpirun (auto: shm) <= 1.05x lockstep-run shm: %.3fx  %s\n",
        ratio, ratio <= 1.05 ? "MET" : "MISSED");
  }
  const Result* r1 = rep.get("shm", "1");
  if (!r2 || !r1) return;
  const double sc = rep.tput(r2, 2) / rep.tput(r1, 1);
  std::printf("\ntarget scaling >= 1.70x (shm): %.2fx  %s\n", sc, sc >= 1.7 ? "MET" : "MISSED");
  if (const Result* p2 = rep.get("pytorch", "2")) {
    const double ratio = r2->at("step") / p2->at("step");
    std::printf("target 2-rank step <= 0.75x PyTorch DDP (shm): %.2fx  %s\n", ratio,
                ratio <= 0.75 ? "MET" : "MISSED");
  }
}

int run_driver(const DdpArgs& a) {
  make_parent_dir(a.out);
  const std::string load_before = loadavg();
  std::printf(
      "lockstep-bench ddp: Mlp 1024-4096-4096-10, batch %d per rank, SGD, 1 compute "
      "thread per rank, %d warm-up + %d timed steps, %d round(s)\n"
      "load average before: %s  (cores: %ld)\n",
      a.batch, a.warmup, a.steps, a.rounds, load_before.c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  const Report rep(a, run_rounds(a), load_before);
  write_csv(rep, a.out);
  print_step_table(rep);
  print_breakdown(rep);
  if (a.profile) print_profile(rep);
  print_targets(rep);
  std::printf("CSV: %s\n", a.out.c_str());
  return 0;
}

// --configs: each a backend shm, gloo or mpi, optionally with :view or :private.
std::string check_configs(const std::string& configs) {
  for (const auto& c : split_csv(configs)) {
    const std::string b = c.substr(0, c.find(':')), v = c.substr(std::min(c.size(), b.size() + 1));
    if ((b != "shm" && b != "gloo" && b != "mpi" && b != "mpirun") ||
        (!v.empty() && v != "view" && v != "private"))
      return "unknown config '" + c +
             "' (a backend shm, gloo or mpi, or mpirun (mpirun with the default backend), "
             "optionally with :view or :private)";
  }
  return "";
}

// --nproc: rank counts, comma-separated.
std::string check_nprocs(const std::string& nprocs) {
  for (const auto& n : split_csv(nprocs))
    if (n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1)
      return "'" + n + "' is not a rank count";
  return "";
}

}  // namespace

Command ddp_command(CLI::App& bench) {
  auto a = std::make_shared<DdpArgs>();
  CLI::App* app = bench.add_subcommand(
      "ddp",
      "the DDP training step of lockstep beside PyTorch's own DDP (Gloo), same model "
      "and data");
  app->add_option("--nproc", a->nprocs, "rank counts, comma-separated")
      ->check(check_nprocs)
      ->capture_default_str();
  app->add_option("--configs", a->configs,
                  "lockstep configs, comma-separated: shm, gloo, mpi, mpirun (under mpirun, "
                  "default backend), shm:view, shm:private")
      ->check(check_configs)
      ->capture_default_str();
  app->add_option("--steps", a->steps, "timed steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--warmup", a->warmup, "warm-up steps")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--batch", a->batch, "samples per rank and step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--rounds", a->rounds, "rounds of every job (medians over rounds)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--out", a->out, "CSV file")->capture_default_str();
  app->add_flag("--skip-peer", a->skip_peer, "leave PyTorch's DDP out");
  app->add_option("--python", a->python, "the interpreter that runs the peer (python3-torch)")
      ->capture_default_str();
  app->add_option("--peer-script", a->peer_script,
                  "the peer (default: <source>/bench/peers/pytorch_ddp.py)");
  app->add_flag("--profile", a->profile, "also time the step's components in isolation");
  app->add_flag("--bf16", a->bf16, "forward and loss under bf16 autocast, on every side");
  app->add_flag("--worker", a->worker)->group(kWorkerOnly);
  app->add_option("--backend", a->backend)->group(kWorkerOnly);
  app->add_flag("--view", a->view)->group(kWorkerOnly);
  app->add_flag("--private", a->private_buckets)->group(kWorkerOnly);
  return {app, [a] { return a->worker ? ddp_worker(*a) : run_driver(*a); }};
}

}  // namespace lockstep::bench
