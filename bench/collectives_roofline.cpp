#include "collectives_roofline.h"

#include "bench_util.h"
#include "comm/reduce_kernels.h"  // copy_streaming: the non-temporal copy shm uses

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace lockstep::bench {
namespace {

// Fewer runs than the collectives: the kernels are simple and the same on every rank.
constexpr RunCount kStreamRuns{.warmup = 1, .min_iters = 5, .max_iters = 30, .min_seconds = 0.15};

void add_into(float* __restrict a, const float* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

// {median, best} over runs of the slowest rank's seconds for `fn`.
std::pair<double, double> slowest(comm::ProcessGroup& control, const std::function<void()>& fn) {
  std::vector<double> runs = time_runs(fn, &control, kStreamRuns);
  auto t = at::tensor({median(runs), *std::min_element(runs.begin(), runs.end())}, at::kDouble);
  control.allreduce(t, {comm::ReduceOp::Max})->wait();
  return {t[0].item<double>(), t[1].item<double>()};
}

}  // namespace

StreamResult measure_stream(comm::ProcessGroup& control, int64_t bytes) {
  const int64_t n = std::max<int64_t>(bytes / 4, 16);
  at::Tensor a = at::full({n}, 1.0f), b = at::full({n}, 0.0f);  // pages touched
  char* pa = static_cast<char*>(a.data_ptr());
  char* pb = static_cast<char*>(b.data_ptr());
  const double nb = n * 4.0;
  const auto memcpy_t = slowest(control, [&] { std::memcpy(pb, pa, n * 4); });
  const auto nt_t = slowest(control, [&] { comm::copy_streaming(pb, pa, n * 4); });
  // a += b with b = 1e-30: a stays ~1, no overflow or denormals over the runs
  b.fill_(1e-30f);
  const auto rmw_t =
      slowest(control, [&] { add_into(a.data_ptr<float>(), b.data_ptr<float>(), n); });
  StreamResult r;
  r.median = {2 * nb / std::min(memcpy_t.first, nt_t.first) / 1e9, 3 * nb / rmw_t.first / 1e9};
  r.best = {2 * nb / std::min(memcpy_t.second, nt_t.second) / 1e9, 3 * nb / rmw_t.second / 1e9};
  return r;
}

double min_traffic_bytes(const std::string& op, int64_t bytes, int p) {
  if (p <= 1) return 0;
  const double n = static_cast<double>(bytes);
  if (op == "allreduce") return 2 * n;
  if (op == "reduce_scatter" || op == "allgather") return n + n / p;
  return 0;
}

const char* bound_kernel(const std::string& op) { return op == "reduce_scatter" ? "rmw" : "copy"; }

double bound_seconds(const std::string& op, int64_t bytes, int p, const StreamBandwidth& bw) {
  const double gbps = op == "reduce_scatter" ? bw.rmw : bw.copy;
  return gbps > 0 ? min_traffic_bytes(op, bytes, p) / (gbps * 1e9) : 0;
}

}  // namespace lockstep::bench
