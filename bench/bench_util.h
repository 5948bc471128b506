// Shared helpers of lockstep-bench: timing, statistics, tables, CSV, sizes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lockstep::bench {

double now_s();
double median(std::vector<double> v);
// Runs fn `warmup` times, then until `min_iters` runs and `min_seconds` elapsed (at most
// max_iters); returns the per-run times. `sync` runs before every timed run (outside the time).
std::vector<double> time_runs(const std::function<void()>& fn, const std::function<void()>& sync,
                              int warmup, int min_iters, int max_iters, double min_seconds);

// "4KiB" / "16MiB" / "1GiB" <-> bytes.
int64_t parse_size(const std::string& s);
std::string format_size(int64_t bytes);
std::vector<int64_t> parse_sizes(const std::string& csv);

// Single-core memcpy bandwidth in GB/s over `bytes` (the roofline for shared-memory copies).
double memcpy_gbps(int64_t bytes);

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
