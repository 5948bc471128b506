// Multi-process check of the compressed allreduce: closed-form sums within the stated
// bound, bit-identical replicas, odd sizes, dtypes, plain layers, NaN reporting.
// Run under lockstep-run (any backend, 1..4 ranks); exits non-zero on any failure.
#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/lockstep.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstring>

using namespace lockstep::compress;

namespace {

int failures = 0;
#define EXPECT(cond, ...)                                          \
  do {                                                             \
    if (!(cond)) {                                                 \
      ++failures;                                                  \
      std::fprintf(stderr, "FAIL %s:%d: %s ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                           \
      std::fprintf(stderr, "\n");                                  \
    }                                                              \
  } while (0)

// Rank r's input, known to every rank so the expected sum is closed form.
float input(int r, int64_t i) { return std::sin(0.37f * float(i) + float(r)) * (1.0f + 0.5f * float(r)); }

double bucket_unit(int r, int64_t lo_i, int64_t hi_i, int bits, at::ScalarType dt) {
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = lo_i; i < hi_i; ++i) {
    float v = at::tensor({input(r, i)}).to(dt).to(at::kFloat).item<float>();
    lo = std::min(lo, v), hi = std::max(hi, v);
  }
  return unit_for(lo, hi, bits);
}

void check_case(lockstep::ProcessGroup& g, int64_t n, int bits, at::ScalarType dt, bool average) {
  const int P = g.size(), me = g.rank();
  QsgdOptions o;
  o.bits = bits;
  o.min_layer = 0;
  o.exclude = {};
  o.seed = 7;
  at::Tensor x = at::empty({n}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) x[i] = input(me, i);
  at::Tensor t = x.to(dt);
  CompressedAllreduce plan(o, {{"w", 0, n}}, n, P);
  plan.run(g, t, average);
  // Expected: sum of every rank's (dtype-rounded) input; bound per bucket: one unit of
  // each sender's bucket (quantization #1) + one unit of the sum (quantization #2),
  // plus the output dtype's rounding.
  double worst = 0, max_err = 0;
  const int L = (1 << bits) - 1;
  for (int64_t b = 0; b < n; b += o.bucket_size) {
    const int64_t e = std::min(n, b + o.bucket_size);
    double u1 = 0;
    for (int r = 0; r < P; ++r) u1 += bucket_unit(r, b, e, bits, dt);
    double lo = INFINITY, hi = -INFINITY;
    std::vector<double> exact;
    for (int64_t i = b; i < e; ++i) {
      double s = 0;
      for (int r = 0; r < P; ++r) s += at::tensor({input(r, i)}).to(dt).to(at::kFloat).item<float>();
      if (average) s /= P;
      exact.push_back(s);
      lo = std::min(lo, s), hi = std::max(hi, s);
    }
    const double scale = average ? 1.0 / P : 1.0;
    const double u2 = (hi - lo + 2 * u1 * scale) / L;
    const double dt_eps = dt == at::kFloat ? 1e-6 : (dt == at::kHalf ? 1e-3 : 8e-3);
    for (int64_t i = b; i < e; ++i) {
      const double got = t[i].to(at::kFloat).item<double>();
      const double err = std::fabs(got - exact[size_t(i - b)]);
      const double bound = P == 1 ? 0 : u1 * scale + u2;
      const double slack = dt_eps * (std::fabs(exact[size_t(i - b)]) + 1) + 1e-5;
      max_err = std::max(max_err, err);
      if (bound > 0) worst = std::max(worst, (err - slack) / bound);
      EXPECT(err <= bound + slack, "n=%ld bits=%d %s i=%ld err %.3g bound %.3g", long(n), bits,
             c10::toString(dt), long(i), err, bound);
    }
  }
  // Every replica must hold identical bits. (n == 0: nothing to compare; the gloo
  // backend of lockstep_comm also rejects 0-element allgathers at the time of writing.)
  if (n == 0) return;
  at::Tensor all = at::empty({P * n}, t.options());
  g.allgather(all, t)->wait();
  for (int r = 0; r < P; ++r)
    EXPECT(std::memcmp(all.data_ptr(), static_cast<char*>(all.data_ptr()) + r * n * t.element_size(),
                       size_t(n * t.element_size())) == 0,
           "replica %d differs from rank 0 (n=%ld bits=%d)", r, long(n), bits);
  if (me == 0 && n > 1000)
    std::printf("P=%d n=%-7ld bits=%d %-9s %s: max err %.3g, worst (err-slack)/bound %.3f (<= 1)\n", P,
                long(n), bits, c10::toString(dt), average ? "avg" : "sum", max_err, worst);
}

void check_mixed_layers_and_nan(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  // weight (compressed), bias (plain: excluded), small (plain: under min_layer), hole.
  std::vector<LayerSpan> layers{{"a.weight", 0, 3000}, {"a.bias", 3000, 64},
                                {"b.weight", 3064, 2049}, {"c.weight", 5200, 100}};
  const int64_t n = 5400;
  QsgdOptions o;  // defaults: 4 bits, exclude bias/norm, min_layer 1024
  at::Tensor t = at::empty({n}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) t[i] = input(me, i);
  CompressedAllreduce plan(o, layers, n, P);
  plan.run(g, t, /*average=*/true);
  // Plain parts are exact averages (up to float summation order).
  for (int64_t i : {3000L, 3063L, 5200L, 5299L, 5150L, 5399L}) {
    double s = 0;
    for (int r = 0; r < P; ++r) s += input(r, i);
    EXPECT(std::fabs(t[i].item<double>() - s / P) < 1e-5, "plain element %ld: %g vs %g", long(i),
           t[i].item<double>(), s / P);
  }
  // NaN on the last rank in b.weight: every rank raises, naming the layer.
  for (int64_t i = 0; i < n; ++i) t[i] = input(me, i);
  if (me == P - 1) t[4000] = NAN;
  std::string named;
  try {
    plan.run(g, t, true);
  } catch (const NonFiniteGradient& e) {
    named = e.layer();
    if (me == 0) std::printf("NaN reported on every rank: %s\n", e.what());
  }
  EXPECT(named == "b.weight", "expected NonFiniteGradient naming b.weight, got '%s'", named.c_str());
  // Inf in a plain layer is reported too.
  for (int64_t i = 0; i < n; ++i) t[i] = input(me, i);
  if (me == 0) t[3010] = INFINITY;
  named.clear();
  try {
    plan.run(g, t, true);
  } catch (const NonFiniteGradient& e) {
    named = e.layer();
  }
  EXPECT(named == "a.bias", "expected NonFiniteGradient naming a.bias, got '%s'", named.c_str());
}

}  // namespace

int main() {
  try {
    auto g = lockstep::init();
    const int P = g->size();
    for (int64_t n : {0L, 1L, 127L, 128L, 129L, 1000L, 4099L, 100003L})
      for (int bits : {2, 4, 8}) check_case(*g, n, bits, at::kFloat, false);
    check_case(*g, 50001, 1, at::kFloat, true);
    check_case(*g, 4099, 4, at::kBFloat16, true);
    check_case(*g, 4099, 8, at::kHalf, false);
    check_mixed_layers_and_nan(*g);
    g->barrier()->wait();
    if (g->rank() == 0)
      std::printf("compress_check %s: P=%d backend=%s, %d failures\n", failures ? "FAILED" : "passed",
                  P, g->backend_name().c_str(), failures);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compress_check: %s\n", e.what());
    return 1;
  }
}
