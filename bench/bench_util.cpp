#include "bench_util.h"

#include <lockstep/comm/process_group.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <stdexcept>

namespace lockstep::bench {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> time_runs(const std::function<void()>& fn, comm::ProcessGroup* group,
                              const RunCount& count) {
  auto sync = [&] {
    if (group) group->barrier()->wait();
  };
  std::vector<double> times;
  auto timed_run = [&] {
    sync();
    const double t0 = now_s();
    fn();
    times.push_back(now_s() - t0);
  };
  for (int i = 0; i < count.warmup; ++i) {
    sync();
    fn();
  }
  const double start = now_s();
  for (int i = 0; i < count.min_iters; ++i) timed_run();
  // Taken on every rank alike (count is the same everywhere), so the broadcast below is
  // issued by all ranks or by none.
  if (count.max_iters > count.min_iters) {
    const int64_t room = count.max_iters - count.min_iters;
    const double elapsed = now_s() - start;
    int64_t more = 0;
    if (elapsed < count.min_seconds) {
      const double per_run = count.min_iters > 0 ? elapsed / count.min_iters : 0;
      more = per_run > 0 ? static_cast<int64_t>(std::ceil((count.min_seconds - elapsed) / per_run))
                         : room;
      more = std::min(more, room);
    }
    if (group) more = decided_by_rank0(*group, more);
    for (int64_t i = 0; i < more; ++i) timed_run();
  }
  return times;
}

double reduced_over_ranks(comm::ProcessGroup& group, double v, comm::ReduceOp op) {
  auto t = at::full({1}, v, at::kDouble);
  comm::AllreduceOptions o;
  o.op = op;
  group.allreduce(t, o)->wait();
  return t.item<double>();
}

int64_t decided_by_rank0(comm::ProcessGroup& group, int64_t v) {
  auto t = at::full({1}, v, at::kLong);
  group.broadcast(t)->wait();  // root 0
  return t.item<int64_t>();
}

bool true_on_all_ranks(comm::ProcessGroup& group, bool ok) {
  auto t = at::full({1}, ok ? 1 : 0, at::kInt);
  comm::AllreduceOptions o;
  o.op = comm::ReduceOp::Min;
  group.allreduce(t, o)->wait();
  return t.item<int>() == 1;
}

int64_t parse_size(const std::string& s) {
  size_t pos = 0;
  double v = std::stod(s, &pos);
  std::string unit = s.substr(pos);
  int64_t mult = 1;
  if (unit == "KiB" || unit == "K" || unit == "k")
    mult = 1 << 10;
  else if (unit == "MiB" || unit == "M")
    mult = 1 << 20;
  else if (unit == "GiB" || unit == "G")
    mult = 1LL << 30;
  else if (!unit.empty() && unit != "B")
    throw std::invalid_argument("size '" + s + "': unit must be B, KiB, MiB or GiB");
  return static_cast<int64_t>(v * mult);
}

std::string format_size(int64_t b) {
  char buf[32];
  if (b >= (1LL << 30) && b % (1LL << 30) == 0)
    std::snprintf(buf, sizeof buf, "%lldGiB", (long long)(b >> 30));
  else if (b >= (1 << 20) && b % (1 << 20) == 0)
    std::snprintf(buf, sizeof buf, "%lldMiB", (long long)(b >> 20));
  else if (b >= (1 << 10) && b % (1 << 10) == 0)
    std::snprintf(buf, sizeof buf, "%lldKiB", (long long)(b >> 10));
  else
    std::snprintf(buf, sizeof buf, "%lldB", (long long)b);
  return buf;
}

std::vector<int64_t> parse_sizes(const std::string& csv) {
  std::vector<int64_t> out;
  for (const auto& item : split_csv(csv)) out.push_back(parse_size(item));
  return out;
}

std::vector<std::string> split_csv(const std::string& csv) {
  std::vector<std::string> out;
  for (size_t b = 0, e; b <= csv.size(); b = e + 1) {
    e = csv.find(',', b);
    if (e == std::string::npos) e = csv.size();
    if (e > b) out.push_back(csv.substr(b, e - b));
  }
  return out;
}

std::string Table::str() const {
  std::vector<size_t> w;
  for (const auto& r : rows_)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  std::ostringstream os;
  for (size_t k = 0; k < rows_.size(); ++k) {
    for (size_t i = 0; i < rows_[k].size(); ++i) {
      const auto& c = rows_[k][i];
      os << (i ? "  " : "") << std::string(w[i] - c.size(), ' ') << c;
    }
    os << "\n";
    if (k == 0) {
      size_t total = 0;
      for (size_t x : w) total += x + 2;
      os << std::string(total - 2, '-') << "\n";
    }
  }
  return os.str();
}

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace lockstep::bench
