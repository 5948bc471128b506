#include "collectives_roofline.h"

#include "bench_util.h"

#include <ATen/ATen.h>

#include <cstring>
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

// Median over runs of the slowest rank's seconds for `fn`.
double slowest_median(comm::ProcessGroup& control, const std::function<void()>& fn) {
  auto t = at::full({1}, median(time_runs(fn, &control, kStreamRuns)), at::kDouble);
  control.allreduce(t, {comm::ReduceOp::Max})->wait();
  return t.item<double>();
}

}  // namespace

StreamBandwidth measure_stream(comm::ProcessGroup& control, int64_t bytes) {
  const int64_t n = std::max<int64_t>(bytes / 4, 16);
  at::Tensor a = at::full({n}, 1.0f), b = at::full({n}, 0.0f);  // pages touched
  char* pa = static_cast<char*>(a.data_ptr());
  char* pb = static_cast<char*>(b.data_ptr());
  const double nb = n * 4.0;
  const double t_memcpy = slowest_median(control, [&] { std::memcpy(pb, pa, n * 4); });
  const double t_nt = slowest_median(control, [&] { copy_nt(pb, pa, n * 4); });
  // a += b with b = 1e-30: a stays ~1, no overflow or denormals over the runs
  b.fill_(1e-30f);
  const double t_rmw =
      slowest_median(control, [&] { add_into(a.data_ptr<float>(), b.data_ptr<float>(), n); });
  return {2 * nb / std::min(t_memcpy, t_nt) / 1e9, 3 * nb / t_rmw / 1e9};
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
