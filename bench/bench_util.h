// Shared helpers of lockstep-bench: timing, statistics, tables, sizes, lists.
#pragma once

#include <lockstep/comm/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::comm {
class ProcessGroup;
}

namespace lockstep::bench {

double now_s();
double median(std::vector<double> v);
// The median over `rows` of one field (e.g. the step time of a run's timed steps).
template <class Row>
double median_of(const std::vector<Row>& rows, double Row::*field) {
  std::vector<double> v;
  v.reserve(rows.size());
  for (const auto& r : rows) v.push_back(r.*field);
  return median(std::move(v));
}

// How many times time_runs runs its function: `warmup` untimed runs, then `min_iters`
// timed ones, then more until `min_seconds` have passed since the first timed run, at
// most `max_iters` timed runs in all.
struct RunCount {
  int warmup = 1;
  int min_iters = 5;
  int max_iters = 5;
  double min_seconds = 0;
};

// Runs fn as `count` says; returns the seconds of each timed run.
//
// With a `group`, every rank of it must call this with the same `count`: each run starts
// after a barrier of `group` (outside the time), and how many runs follow the first
// min_iters is decided once, by rank 0 from its clock, and broadcast. Every rank then
// issues the same collectives in the same order; a count each rank took from its own
// clock would leave the ranks in mismatched collectives. Without a group (nullptr), fn
// runs in this process alone.
std::vector<double> time_runs(const std::function<void()>& fn, comm::ProcessGroup* group,
                              const RunCount& count);

// Collective decisions, for every choice that changes which collectives follow.
// rank 0's `v` on every rank of `group` (one broadcast).
int64_t decided_by_rank0(comm::ProcessGroup& group, int64_t v);
// True on every rank if `ok` is true on every rank (one allreduce).
bool true_on_all_ranks(comm::ProcessGroup& group, bool ok);
// `v` reduced over the ranks by `op` (the maximum by default; one allreduce).
double reduced_over_ranks(comm::ProcessGroup& group, double v,
                          comm::ReduceOp op = comm::ReduceOp::Max);

// "4KiB" / "16MiB" / "1GiB" <-> bytes.
int64_t parse_size(const std::string& s);
std::string format_size(int64_t bytes);
std::vector<int64_t> parse_sizes(const std::string& csv);
// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_csv(const std::string& csv);

// A fixed-width text table.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string fmt(double v, int decimals = 2);

}  // namespace lockstep::bench
