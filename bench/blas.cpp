// lockstep-bench blas: what the BLAS gives a training process on this CPU (docs/launcher.md,
// "The BLAS"): an fp32 GEMM under OpenBLAS's own kernel choice, under the one lockstep-run
// makes, and under other OPENBLAS_CORETYPE values, each in a fresh process (the variable
// is read when OpenBLAS loads), plus a bf16 matmul (oneDNN: AMX or AVX-512 BF16 where the
// CPU has them), all on one thread, as one rank of a job runs.
//
//   lockstep-bench blas [--size 1024] [--reps 10] [--cores Prescott,Haswell,SkylakeX]
//
// The fp32 results of every core are compared (a checksum of the product) so a faster
// kernel that computed something else would show.
#include "bench_util.h"
#include "commands.h"
#include "jobs.h"

#include <lockstep/blas_core.h>
#include <lockstep/launch/rank_env.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::bench {
namespace {

struct Options {
  int64_t size = 1024;
  int reps = 10;
  std::string cores = "Prescott,Haswell,SkylakeX";
  bool worker = false;
};

// GFLOP/s of an n x n x n matmul in `dtype` (median of reps), and a checksum of C.
std::pair<double, double> matmul_gflops(const Options& o, c10::ScalarType dtype) {
  torch::manual_seed(0);
  const auto a = torch::randn({o.size, o.size}).to(dtype);
  const auto b = torch::randn({o.size, o.size}).to(dtype);
  torch::Tensor c;
  const auto s = time_runs([&] { c = torch::mm(a, b); }, nullptr, RunCount{1, o.reps, o.reps, 0});
  const double flops = 2.0 * double(o.size) * double(o.size) * double(o.size);
  return {flops / median(s) / 1e9, c.to(torch::kDouble).abs().sum().item<double>()};
}

int worker(const Options& o) {
  torch::set_num_threads(1);
  const auto [fp32, sum] = matmul_gflops(o, torch::kFloat);
  const auto [bf16, ignored] = matmul_gflops(o, torch::kBFloat16);
  (void)ignored;
  std::printf("RESULT fp32_gflops %.6f\nRESULT fp32_checksum %.17g\nRESULT bf16_gflops %.6f\n",
              fp32, sum, bf16);
  return 0;
}

struct Row {
  std::string coretype;  // "" = OpenBLAS's own pick
  std::string why;
};

std::vector<Row> rows_to_run(const Options& o, const launch::BlasTuning& tuning) {
  std::vector<Row> rows{{"", "OpenBLAS's own pick"}};
  if (auto it = tuning.env.find("OPENBLAS_CORETYPE"); it != tuning.env.end())
    rows.push_back({it->second, "lockstep-run's choice"});
  for (const auto& c : split_csv(o.cores)) {
    bool seen = false;
    for (const auto& r : rows) seen = seen || r.coretype == c;
    if (!seen) rows.push_back({c, ""});
  }
  return rows;
}

std::string worker_command(const Options& o, const std::string& coretype) {
  // The threads part of rank_environment() only: the core type is what varies here.
  return std::string("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 ") +
         (coretype.empty() ? "env -u OPENBLAS_CORETYPE " : "OPENBLAS_CORETYPE=" + coretype + " ") +
         self_command() + " blas --worker --size " + std::to_string(o.size) + " --reps " +
         std::to_string(o.reps);
}

std::string rel_diff(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", std::abs(a - b) / std::abs(b));
  return buf;
}

int driver(const Options& o) {
  const std::string own = launch::probe_openblas_core();
  const launch::BlasTuning tuning =
      launch::blas_tuning({}, own, blas::cpu_isa(), blas::cpu_is_amd());
  std::printf("CPU: %s%s; OpenBLAS picks %s by itself; lockstep-run %s\n",
              blas::isa_name(blas::cpu_isa()), blas::cpu_is_amd() ? " (AMD)" : "",
              own.empty() ? "(no OpenBLAS found)" : own.c_str(),
              tuning.env.empty()
                  ? "leaves it"
                  : ("sets OPENBLAS_CORETYPE=" + tuning.env.at("OPENBLAS_CORETYPE")).c_str());
  Table table({"OPENBLAS_CORETYPE", "", "fp32 GEMM GFLOP/s", "vs own pick", "bf16 GFLOP/s",
               "sum|C| rel. diff"});
  double base = 0, base_sum = 0;
  for (const auto& row : rows_to_run(o, tuning)) {
    const JobOutput job = run_job_quiet(worker_command(o, row.coretype));
    if (job.status != 0 || !job.results.count("fp32_gflops")) {
      std::fprintf(stderr, "blas worker (%s) failed:\n%s", row.coretype.c_str(),
                   job.output.c_str());
      return 1;
    }
    const double g = job.results.at("fp32_gflops"), sum = job.results.at("fp32_checksum");
    if (row.coretype.empty()) base = g, base_sum = sum;
    table.add({row.coretype.empty() ? "(unset: " + own + ")" : row.coretype, row.why, fmt(g, 1),
               fmt(g / base) + "x", fmt(job.results.at("bf16_gflops"), 1),
               rel_diff(sum, base_sum)});
  }
  std::printf("%s", table.str().c_str());
  std::printf(
      "one thread, %lld^3 matmul, median of %d; fp32 through OpenBLAS (each row a fresh "
      "process), bf16 through libtorch's own kernels (oneDNN where built in)\n",
      static_cast<long long>(o.size), o.reps);
  return 0;
}

}  // namespace

Command blas_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app = bench.add_subcommand(
      "blas", "GEMM GFLOP/s under OpenBLAS's kernel choice, lockstep-run's and others; bf16");
  app->add_option("--size", o->size, "matrix size n (n x n x n)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--reps", o->reps, "timed products (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--cores", o->cores, "further OPENBLAS_CORETYPE values to compare")
      ->capture_default_str();
  app->add_flag("--worker", o->worker, "one measurement in this process")->group(kWorkerOnly);
  return {app, [o] { return o->worker ? worker(*o) : driver(*o); }};
}

}  // namespace lockstep::bench
