// lockstep-bench fsdp, driver side: what its parts share. bench/fsdp.cpp runs the jobs of
// the step/memory comparison, bench/fsdp_cap.cpp the search under a memory cap,
// bench/fsdp_report.cpp prints the tables and targets and writes the CSV.
#pragma once

#include "fsdp_bench.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::bench {

using Result = std::map<std::string, double>;  // RESULT key -> value

// The command of one lockstep job: `n` ranks under lockstep-run on shm, `strategy` (ddp or an
// FSDP strategy) on `shape`, each rank under an RLIMIT_DATA of `cap_bytes` (0: none), with
// the environment `env` (default: rank_environment()).
std::string lockstep_job(const FsdpArgs& a, const std::string& strategy, int n,
                         const ModelShape& shape, int64_t cap_bytes, const std::string& env = "");

// How large blocks are served in a capped job: "heap" = lockstep-run's defaults (tensors of
// 128 KiB and more from lockstep's host cache, docs/host-memory.md; the rest from malloc's
// heap, MALLOC_MMAP_MAX_=0), "nocache" = the same with LOCKSTEP_HOST_CACHE=0 (every block
// from the heap, never returned: the heap keeps its peak and its holes), "mmap" = no cache
// and MALLOC_MMAP_THRESHOLD_=1MiB (each large block its own mapping, unmapped when freed).
std::string malloc_environment(const std::string& mode);
std::string loadavg();

// One search for the largest model (in layers) that completes `a.steps` steps under the cap.
struct CapSearch {
  std::string strategy;
  std::string malloc_mode;  // "heap", "nocache" or "mmap" (malloc_environment)
  int ranks = 0;
  int64_t cap = 0;
  int best_layers = 0;     // 0: not even 1 layer fits
  int first_failing = -1;  // the smallest layer count seen failing (-1: none up to the max)
  std::string failure;     // why that one failed
  std::vector<std::pair<int, bool>> attempts;  // (layers, completed), in the order tried
  Result at_best;                              // the worker's figures at best_layers
};
CapSearch search_cap(const FsdpArgs& a, const std::string& strategy, const std::string& malloc_mode,
                     int n, int start_layers);

// Everything the tables are made of.
struct FsdpReport {
  const FsdpArgs& a;
  std::map<std::string, Result> medians;  // result_key(impl, strategy, ranks) -> medians
  std::map<std::string, int> rounds;      // ... -> rounds that produced a step time
  Result grad_check;                      // the peer's gradient check (empty: not run)
  std::string peer_note;                  // why the peer did not run, if it did not
  std::vector<CapSearch> caps;
  std::string load_before, load_after;

  // The medians of impl ("lockstep" or "pytorch") for `strategy` at `ranks`; nullptr when
  // that job produced no step time.
  const Result* get(const std::string& impl, const std::string& strategy, int ranks) const;
};
std::string result_key(const std::string& impl, const std::string& strategy, int ranks);

void print_report(const FsdpReport& rep);
void write_csv(const FsdpReport& rep, const std::string& path);

}  // namespace lockstep::bench
