// lockstep-bench fsdp: lockstep's FSDP (SHARD_GRAD_OP, FULL_SHARD) beside its DDP and
// beside PyTorch's own FSDP (fully_shard over Gloo, Python), same transformer, same data,
// measured in one run: step time, model-state bytes and peak RSS per rank, and the largest
// model that trains under a per-rank memory cap.
//
//   lockstep-bench fsdp [--preset small|100m] [--d-model N] [--layers N] [--seq N]
//                       [--batch N] [--vocab N] [--nproc 2,4] [--strategies ddp,...]
//                       [--steps 5] [--warmup 2] [--rounds 1] [--skip-peer] [--python PATH]
//                       [--cap 1GiB] [--cap-nproc 2] [--cap-max-layers 64] [--skip-cap]
//
// Jobs (each its own; see docs/benchmarks.md, "FSDP"):
//   lockstep-run --nproc-per-node N SELF fsdp --worker --strategy S ...   (shm)
//   N x  RANK=r WORLD_SIZE=N ... .venv-bench/bin/python bench/peers/pytorch_fsdp.py --strategy S
// The peer needs torch 2.x in <source>/.venv-bench (scripts/install-deps.sh --bench); without
// it the driver says how to create it and measures lockstep alone.
#include "bench_util.h"
#include "commands.h"
#include "fsdp_bench.h"
#include "fsdp_driver.h"
#include "jobs.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>

namespace lockstep::bench {

std::string source_dir() { return LOCKSTEP_SOURCE_DIR; }

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string malloc_environment(const std::string& mode) {
  if (mode == "mmap")
    return "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 "
           "MALLOC_MMAP_THRESHOLD_=1048576 LOCKSTEP_HOST_CACHE=0 " +
           blas_environment();
  if (mode == "nocache") return rank_environment() + "LOCKSTEP_HOST_CACHE=0 ";
  return rank_environment();
}

std::string lockstep_job(const FsdpArgs& a, const std::string& strategy, int n,
                         const ModelShape& shape, int64_t cap_bytes, const std::string& env) {
  std::string flags = " fsdp --worker --strategy " + strategy + shape.flags() + " --steps " +
                      std::to_string(a.steps) + " --warmup " + std::to_string(a.warmup);
  if (cap_bytes > 0) flags += " --cap-bytes " + std::to_string(cap_bytes);
  if (a.profile && cap_bytes == 0) flags += " --profile";
  // Under a cap DDP's buckets go to private memory, where RLIMIT_DATA counts them.
  if (cap_bytes > 0 && strategy == "ddp") flags += " --private-buckets";
  return (env.empty() ? rank_environment() : env) + "LOCKSTEP_BACKEND=shm timeout -k 10 " +
         std::to_string(a.job_timeout_s) + " '" LOCKSTEP_RUN_PATH "' --nproc-per-node " +
         std::to_string(n) + " --master-port 0 " + self_command() + flags;
}

namespace {

std::string peer_python(const FsdpArgs& a) {
  return a.python.empty() ? source_dir() + "/.venv-bench/bin/python" : a.python;
}

// Why the peer cannot run ("" if it can).
std::string peer_missing(const FsdpArgs& a) {
  if (a.skip_peer) return "skipped (--skip-peer)";
  if (access(peer_python(a).c_str(), X_OK) == 0) return "";
  return peer_python(a) +
         " not found: PyTorch's FSDP peer needs torch 2.x there; create it with "
         "`scripts/install-deps.sh --bench` (or `make deps-bench`)";
}

// N background processes with the torchrun environment contract; rank 0 in front.
std::string peer_job(const FsdpArgs& a, const std::string& strategy, int n,
                     const std::string& extra) {
  const std::string port = std::to_string(free_port());
  const std::string args = " '" + source_dir() + "/bench/peers/pytorch_fsdp.py' --strategy " +
                           strategy + a.shape.flags() + " --steps " + std::to_string(a.steps) +
                           " --warmup " + std::to_string(a.warmup) + extra;
  std::string cmd = "(";
  for (int r = n - 1; r >= 0; --r) {
    cmd.append(rank_environment()).append("RANK=").append(std::to_string(r));
    cmd.append(" WORLD_SIZE=").append(std::to_string(n));
    cmd.append(" MASTER_ADDR=127.0.0.1 MASTER_PORT=").append(port);
    cmd.append(" timeout -k 10 ").append(std::to_string(a.job_timeout_s));
    cmd.append(" '").append(peer_python(a)).append("'").append(args);
    cmd += r ? " >/dev/null 2>&1 & " : "; wait)";
  }
  return cmd;
}

std::vector<int> rank_counts(const std::string& csv) {
  std::vector<int> out;
  for (const auto& s : split_csv(csv)) out.push_back(std::stoi(s));
  return out;
}

using RawResults = std::map<std::string, std::vector<Result>>;

Result run_one(const std::string& what, int round, const std::string& cmd) {
  std::printf("\n== round %d: %s  [load %s]\n", round + 1, what.c_str(), loadavg().c_str());
  std::fflush(stdout);
  Result r = run_job(cmd);
  if (!r.count("completed")) std::printf("(no result: the job failed)\n");
  return r;
}

// Every round runs every (ranks, strategy) of lockstep and then of the peer.
RawResults run_rounds(const FsdpArgs& a, bool peer) {
  RawResults raw;
  for (int round = 0; round < a.rounds; ++round)
    for (const int n : rank_counts(a.nprocs)) {
      for (const auto& s : split_csv(a.strategies)) {
        const std::string what = "lockstep " + s + ", " + std::to_string(n) + " ranks";
        raw[result_key("lockstep", s, n)].push_back(
            run_one(what, round, lockstep_job(a, s, n, a.shape, 0)));
      }
      if (!peer) continue;
      for (const auto& s : split_csv(a.strategies)) {
        if (s == "no_shard") continue;  // PyTorch's is DDP; measured as "ddp"
        const std::string what = "PyTorch " + s + " (gloo), " + std::to_string(n) + " ranks";
        raw[result_key("pytorch", s, n)].push_back(run_one(what, round, peer_job(a, s, n, "")));
      }
    }
  return raw;
}

void take_medians(FsdpReport& rep, const RawResults& raw) {
  for (const auto& [key, rounds] : raw) {
    std::map<std::string, std::vector<double>> all;
    for (const auto& r : rounds)
      if (r.count("step"))
        for (const auto& [k, v] : r) all[k].push_back(v);
    for (auto& [k, v] : all) rep.medians[key][k] = median(v);
    rep.rounds[key] = all.count("step") ? static_cast<int>(all["step"].size()) : 0;
  }
}

void print_header(const FsdpArgs& a) {
  const auto& s = a.shape;
  std::printf(
      "lockstep-bench fsdp: transformer d_model %lld, %lld layers, %lld heads, seq %lld, vocab "
      "%lld: %.1fM parameters (largest unit: one block, %.1fM); batch %lld x %lld tokens per "
      "rank; fp32 AdamW; 1 compute thread per rank; %d warm-up + %d timed steps, %d round(s)\n"
      "load average before: %s  (cores: %ld)\n",
      (long long)s.d_model, (long long)s.layers, (long long)s.heads(), (long long)s.seq,
      (long long)s.vocab, s.total_params() / 1e6, s.block_params() / 1e6, (long long)s.batch,
      (long long)s.seq, a.warmup, a.steps, a.rounds, loadavg().c_str(),
      sysconf(_SC_NPROCESSORS_ONLN));
}

// The caps, per malloc setting and rank count: DDP first, then FULL_SHARD starting from
// DDP's largest.
std::vector<CapSearch> run_caps(const FsdpArgs& a) {
  std::vector<CapSearch> out;
  if (a.skip_cap) return out;
  for (const auto& mode : split_csv(a.cap_malloc))
    for (const int n : rank_counts(a.cap_nprocs)) {
      out.push_back(search_cap(a, "ddp", mode, n, 1));
      out.push_back(search_cap(a, "full_shard", mode, n, std::max(1, out.back().best_layers)));
    }
  return out;
}

int run_driver(const FsdpArgs& a) {
  make_parent_dir(a.out);
  print_header(a);
  FsdpReport rep{a, {}, {}, {}, peer_missing(a), {}, loadavg(), ""};
  if (!rep.peer_note.empty()) std::printf("PyTorch peer: %s\n", rep.peer_note.c_str());
  if (rep.peer_note.empty()) {
    const int n = rank_counts(a.nprocs).front();
    rep.grad_check = run_one("PyTorch fully_shard gradient check, " + std::to_string(n) + " ranks",
                             0, peer_job(a, "full_shard", n, " --check-grads"));
  }
  take_medians(rep, run_rounds(a, rep.peer_note.empty()));
  rep.caps = run_caps(a);
  rep.load_after = loadavg();
  print_report(rep);
  write_csv(rep, a.out);
  std::printf("CSV: %s\n", a.out.c_str());
  return 0;
}

std::string check_strategies(const std::string& csv) {
  for (const auto& s : split_csv(csv))
    if (s != "ddp" && s != "no_shard" && s != "shard_grad_op" && s != "full_shard")
      return "unknown strategy '" + s + "' (ddp, no_shard, shard_grad_op, full_shard)";
  return "";
}

std::string check_nprocs(const std::string& csv) {
  for (const auto& n : split_csv(csv))
    if (n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1)
      return "'" + n + "' is not a rank count";
  return "";
}

void add_shape_options(CLI::App* app, FsdpArgs& a, std::string& preset) {
  app->add_option("--preset", preset,
                  "small: d_model 512, 4 layers (13.7M parameters); 100m: d_model 1024, 8 "
                  "layers (103M); --d-model/--layers override it")
      ->check(CLI::IsMember({"small", "100m"}))
      ->capture_default_str();
  app->add_option("--d-model", a.shape.d_model, "model width (heads of 64)")
      ->check(CLI::PositiveNumber);
  app->add_option("--layers", a.shape.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app->add_option("--seq", a.shape.seq, "tokens per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--batch", a.shape.batch, "sequences per rank and step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--vocab", a.shape.vocab, "vocabulary")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void add_driver_options(CLI::App* app, FsdpArgs& a) {
  app->add_option("--nproc", a.nprocs, "rank counts, comma-separated")
      ->check(check_nprocs)
      ->capture_default_str();
  app->add_option("--strategies", a.strategies,
                  "comma-separated: ddp, no_shard, shard_grad_op, full_shard")
      ->check(check_strategies)
      ->capture_default_str();
  app->add_option("--steps", a.steps, "timed steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--warmup", a.warmup, "warm-up steps (memory is sampled in these)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app->add_option("--rounds", a.rounds, "rounds of every job (medians over rounds)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--skip-peer", a.skip_peer, "leave PyTorch's FSDP out");
  app->add_option("--python", a.python,
                  "the peer's interpreter (default: <source>/.venv-bench/bin/python)");
  app->add_option(
         "--cap", a.cap,
         "per-rank memory cap (RLIMIT_DATA) of the largest-model search (--preset 100m: 2GiB)")
      ->capture_default_str();
  app->add_option("--cap-nproc", a.cap_nprocs, "rank counts of the cap search")
      ->check(check_nprocs)
      ->capture_default_str();
  app->add_option("--cap-malloc", a.cap_malloc,
                  "memory settings of the cap search: heap (lockstep-run's defaults, with "
                  "the host cache), nocache (LOCKSTEP_HOST_CACHE=0), mmap "
                  "(MALLOC_MMAP_THRESHOLD_=1MiB, no cache)")
      ->check([](const std::string& csv) {
        for (const auto& m : split_csv(csv))
          if (m != "heap" && m != "nocache" && m != "mmap")
            return "unknown memory setting '" + m + "' (heap, nocache, mmap)";
        return std::string();
      })
      ->capture_default_str();
  app->add_option("--cap-steps", a.cap_steps, "steps each attempt of the cap search must complete")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--cap-max-layers", a.cap_max_layers, "the search stops there")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--skip-cap", a.skip_cap, "leave the cap search out");
  app->add_flag("--profile", a.profile, "also time FSDP's per-unit costs in isolation");
  app->add_option("--job-timeout", a.job_timeout_s, "seconds before a job is killed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--out", a.out, "CSV file")->capture_default_str();
}

}  // namespace

Command fsdp_command(CLI::App& bench) {
  auto a = std::make_shared<FsdpArgs>();
  auto preset = std::make_shared<std::string>("small");
  CLI::App* app = bench.add_subcommand(
      "fsdp",
      "FSDP (shard_grad_op, full_shard) beside DDP and PyTorch's own FSDP: step time, memory "
      "per rank, largest model under a memory cap");
  add_shape_options(app, *a, *preset);
  add_driver_options(app, *a);
  app->add_flag("--worker", a->worker)->group(kWorkerOnly);
  app->add_option("--strategy", a->strategy)->group(kWorkerOnly);
  app->add_flag("--private-buckets", a->private_buckets)->group(kWorkerOnly);
  app->add_option("--cap-bytes", a->cap_bytes)->group(kWorkerOnly);
  app->add_option("--gather-bits", a->gather_bits)->group(kWorkerOnly);
  app->add_option("--reduce-bits", a->reduce_bits)->group(kWorkerOnly);
  app->add_flag("--hpz", a->hpz)->group(kWorkerOnly);
  return {app, [a, preset, app] {
            if (*preset == "100m") {  // unless given explicitly
              if (app->count("--d-model") == 0) a->shape.d_model = 1024;
              if (app->count("--layers") == 0) a->shape.layers = 8;
            }
            if (!a->worker && app->count("--cap") == 0 && *preset == "100m") a->cap = "2GiB";
            return a->worker ? fsdp_worker(*a) : run_driver(*a);
          }};
}

}  // namespace lockstep::bench
