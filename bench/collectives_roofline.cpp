#include "collectives_roofline.h"

#include "bench_util.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace lockstep::bench {
namespace {

// Fewer runs than the collectives: the kernels are simple and the same on every rank.
constexpr RunCount kStreamRuns{.warmup = 1, .min_iters = 5, .max_iters = 30, .min_seconds = 0.15};

// b = a with non-temporal stores (no read for ownership of b's lines). Both 64-byte
// aligned (at::empty's allocations are), n a multiple of 64 bytes; the rest plainly.
void copy_nt(char* b, const char* a, int64_t n) {
#if defined(__x86_64__)
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i x0 = _mm_load_si128(reinterpret_cast<const __m128i*>(a + i));
    const __m128i x1 = _mm_load_si128(reinterpret_cast<const __m128i*>(a + i + 16));
    const __m128i x2 = _mm_load_si128(reinterpret_cast<const __m128i*>(a + i + 32));
    const __m128i x3 = _mm_load_si128(reinterpret_cast<const __m128i*>(a + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(b + i), x0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(b + i + 16), x1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(b + i + 32), x2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(b + i + 48), x3);
  }
  std::memcpy(b + i, a + i, n - i);
  _mm_sfence();
#else
  std::memcpy(b, a, n);
#endif
}

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
  const auto nt_t = slowest(control, [&] { copy_nt(pb, pa, n * 4); });
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
