// lockstep-bench fsdp: the largest model (in layers of the benchmark's transformer) that
// completes `steps` steps when every rank runs under RLIMIT_DATA = cap. Each attempt is a
// separate job (lockstep-run, `steps` steps, no warm-up); the search doubles the layer count
// from a start until an attempt fails, then bisects between the last success and the first
// failure. An attempt fails when a rank's allocation is refused (libtorch's "not enough
// memory", std::bad_alloc) or for any other reason, which the table then names.
#include "bench_util.h"
#include "fsdp_driver.h"
#include "jobs.h"

#include <cstdio>
#include <sstream>

namespace lockstep::bench {
namespace {

// Why a job failed, in a few words, from what it printed.
std::string failure_reason(const JobOutput& out) {
  for (const char* oom :
       {"not enough memory", "bad_alloc", "Cannot allocate memory", "can't allocate memory",
        "out of memory", "Resource temporarily unavailable"})
    if (out.output.find(oom) != std::string::npos)
      return "out of memory (" + std::string(oom) + ")";
  if (WIFEXITED(out.status) && WEXITSTATUS(out.status) == 124) return "timed out";
  std::istringstream lines(out.output);
  for (std::string line; std::getline(lines, line);)
    if (line.find("rror") != std::string::npos) return line.substr(0, 160);
  return "exit status " + std::to_string(out.status);
}

// One attempt at `layers`: its figures if it completed, and why not otherwise.
bool attempt(const FsdpArgs& a, CapSearch& s, int layers) {
  ModelShape shape = a.shape;
  shape.layers = layers;
  FsdpArgs job = a;
  job.warmup = 0;
  job.steps = a.cap_steps;
  const double t0 = now_s();
  const JobOutput out = run_job_quiet(
      lockstep_job(job, s.strategy, s.ranks, shape, s.cap, malloc_environment(s.malloc_mode)));
  const bool ok = out.status == 0 && out.results.count("completed") != 0;
  s.attempts.emplace_back(layers, ok);
  std::printf("  %s, %d ranks, %d layers (%.1fM parameters): %s  [%.0f s, load %s]\n",
              s.strategy.c_str(), s.ranks, layers, shape.total_params() / 1e6,
              ok ? "completed" : ("FAILED: " + failure_reason(out)).c_str(), now_s() - t0,
              loadavg().c_str());
  std::fflush(stdout);
  if (ok && layers > s.best_layers) {
    s.best_layers = layers;
    s.at_best = out.results;
  }
  if (!ok && (s.first_failing < 0 || layers < s.first_failing)) {
    s.first_failing = layers;
    s.failure = failure_reason(out);
  }
  return ok;
}

}  // namespace

CapSearch search_cap(const FsdpArgs& a, const std::string& strategy, const std::string& malloc_mode,
                     int n, int start_layers) {
  CapSearch s;
  s.strategy = strategy;
  s.malloc_mode = malloc_mode;
  s.ranks = n;
  s.cap = parse_size(a.cap);
  std::printf(
      "\n== largest model under RLIMIT_DATA %s per rank: %s, %d ranks, %d steps, malloc %s\n",
      a.cap.c_str(), strategy.c_str(), n, a.cap_steps, malloc_mode.c_str());
  int lo = 0, hi = a.cap_max_layers + 1;  // lo completed (0: none yet), hi failed (or beyond)
  int next = std::min(std::max(1, start_layers), a.cap_max_layers);
  while (hi - lo > 1) {
    if (attempt(a, s, next)) {
      lo = next;
      next = hi > a.cap_max_layers ? std::min(2 * lo, a.cap_max_layers) : (lo + hi) / 2;
      if (next == lo) break;  // at the maximum
    } else {
      hi = next;
      next = (lo + hi) / 2;
      if (next == lo) break;
    }
  }
  return s;
}

}  // namespace lockstep::bench
