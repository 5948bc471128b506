// Multi-process check of FSDP's compressed collectives: the QSGD reduce-scatter (within its
// bound, unbiased over many draws, deterministic, plain layers exact, NaN named on every
// rank) and the quantized all-gather (within its bound, every rank bit-identical).
// Run under lockstep-run (any backend, 1..4 ranks); exits non-zero on any failure.
#include <lockstep/compress/compressed_reduce_scatter.h>
#include <lockstep/compress/quantized_allgather.h>
#include <lockstep/lockstep.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tally.h"

using namespace lockstep::compress;

namespace {

float input(int r, int64_t i) {
  return std::sin(0.37f * float(i) + float(r)) * (1.0f + 0.5f * float(r)) + 0.01f * float(i % 7);
}

at::Tensor inputs(int r, int64_t n, at::ScalarType dt) {
  at::Tensor x = at::empty({n}, at::kFloat);
  float* p = x.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = input(r, i);
  return x.to(dt);
}

// The quantization step of the bucket of `x` holding element i, buckets of B from `start`.
double unit_at(const at::Tensor& x, int64_t start, int64_t end, int64_t i, int64_t B, int bits) {
  const int64_t b0 = start + (i - start) / B * B, b1 = std::min(end, b0 + B);
  const at::Tensor s = x.narrow(0, b0, b1 - b0).to(at::kDouble);
  return unit_for(s.min().item<double>(), s.max().item<double>(), bits);
}

// One layer over the whole buffer: each element within the sum of the senders' units (one
// quantization of every other rank's value; the owner's own value is exact).
void check_reduce_scatter_bound(lockstep::ProcessGroup& g, int64_t n, int bits, at::ScalarType dt) {
  const int P = g.size(), me = g.rank();
  QsgdOptions o;
  o.bits = bits, o.min_layer = 0, o.exclude = {}, o.seed = 11;
  CompressedReduceScatter rs(o, {{"w", 0, P * n}}, n, P);
  at::Tensor in = inputs(me, P * n, dt), out = at::empty({n}, in.options());
  rs.run(g, out, in, /*average=*/true);
  std::vector<at::Tensor> all;
  all.reserve(size_t(P));
  for (int r = 0; r < P; ++r) all.push_back(inputs(r, P * n, dt).to(at::kFloat));
  const at::Tensor got = out.to(at::kDouble);
  const double eps = dt == at::kFloat ? 1e-6 : 8e-3;
  double worst = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = me * n + j;
    double exact = 0, bound = 0;
    for (int r = 0; r < P; ++r) {
      exact += all[size_t(r)][i].item<double>();
      if (r != me) bound += unit_at(all[size_t(r)], me * n, me * n + n, i, o.bucket_size, bits);
    }
    const double err = std::fabs(got[j].item<double>() - exact / P);
    worst = std::max(worst, err / (bound / P + eps * (std::fabs(exact / P) + 1)));
  }
  tally::check(tally::format("reduce-scatter n=%ld bits=%d %s: every element within its bound",
                             long(n), bits, c10::toString(dt)),
               worst <= 1, tally::format("worst err / bound %.3f (<= 1)", worst));
}

// Unbiased: the mean of K calls (different rounding each) approaches the exact average
// within 6 standard errors per element (Var <= unit^2 / 4 per quantized value).
void check_reduce_scatter_unbiased(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  if (P == 1) return;
  const int64_t n = 600;
  const int K = 400;
  QsgdOptions o;
  o.bits = 2, o.min_layer = 0, o.exclude = {}, o.seed = 3;
  CompressedReduceScatter rs(o, {{"w", 0, P * n}}, n, P);
  at::Tensor in = inputs(me, P * n, at::kFloat), out = at::empty({n}, in.options());
  at::Tensor mean = at::zeros({n}, at::kDouble);
  for (int k = 0; k < K; ++k) {
    rs.run(g, out, in, true);
    mean += out.to(at::kDouble);
  }
  mean /= K;
  double worst = 0, bias = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = me * n + j;
    double exact = 0, var = 0;
    for (int r = 0; r < P; ++r) {
      const at::Tensor x = inputs(r, P * n, at::kFloat);
      exact += x[i].item<double>();
      if (r != me) var += std::pow(unit_at(x, me * n, me * n + n, i, o.bucket_size, 2), 2) / 4;
    }
    const double se = std::sqrt(var) / P / std::sqrt(double(K));
    const double d = mean[j].item<double>() - exact / P;
    bias += d;
    worst = std::max(worst, std::fabs(d) / (se + 1e-12));
  }
  tally::check("reduce-scatter: unbiased (mean of 400 draws within 6 standard errors)", worst < 6,
               tally::format("worst |mean - exact| / se %.2f, mean deviation %.2e", worst,
                             bias / double(n)));
}

// Plain layers exact; same call number -> same bits; NaN named on every rank.
void check_reduce_scatter_layers(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  const int64_t n = 2500;  // the layers below cross the parts' boundaries at P >= 2
  std::vector<LayerSpan> layers{
      {"a.weight", 0, 2000}, {"a.bias", 2000, 64}, {"b.weight", 2100, P * n - 2200}};
  QsgdOptions o;  // 4 bits, bias and norm plain, min_layer 1024
  CompressedReduceScatter rs(o, layers, n, P);
  at::Tensor in = inputs(me, P * n, at::kFloat), out = at::empty({n}, in.options());
  rs.set_steps(5);
  rs.run(g, out, in, true);
  at::Tensor again = at::empty({n}, in.options());
  rs.set_steps(5);
  rs.run(g, again, in, true);
  tally::check("reduce-scatter: the same call number gives the same bits",
               std::memcmp(out.data_ptr(), again.data_ptr(), size_t(n) * 4) == 0);
  for (int64_t i : {2000L, 2063L, 2070L, 2099L})
    if (i >= me * n && i < (me + 1) * n) {
      double s = 0;
      for (int r = 0; r < P; ++r) s += input(r, i);
      const double got = out[i - me * n].item<double>();
      tally::check(tally::format("plain element %ld is the exact average", long(i)),
                   std::fabs(got - s / P) < 1e-5, tally::format("%g vs %g", got, s / P));
    }
  if (me == P - 1) in[P * n - 150] = NAN;  // b.weight, in the last part
  std::string named;
  try {
    rs.run(g, out, in, true);
  } catch (const NonFiniteGradient& e) {
    named = e.layer();
  }
  tally::check("reduce-scatter NaN: every rank names b.weight", named == "b.weight",
               "got '" + named + "'");
  at::Tensor one = at::ones({1});
  g.allreduce(one)->wait();
  tally::check("the group works after the NaN", one.item<float>() == float(P));
}

// Every rank decodes every part: identical bits everywhere, each value within half a unit
// of its bucket (buckets from each part's start), plain layers exact.
void check_allgather(lockstep::ProcessGroup& g, int64_t n, int bits, at::ScalarType out_dt) {
  const int P = g.size(), me = g.rank();
  QsgdOptions o;
  o.bits = bits, o.min_layer = 0, o.exclude = {"norm"};
  std::vector<LayerSpan> layers{{"w", 0, P * n - 40}, {"norm.weight", P * n - 40, 40}};
  QuantizedAllgather ag(o, layers, n, P);
  const at::Tensor full = inputs(0, P * n, at::kFloat);  // the model every rank gathers
  const at::Tensor mine = full.narrow(0, me * n, n).clone();
  at::Tensor out = at::empty({P * n}, out_dt);
  ag.run_async(g, out, mine)->wait();
  const double eps = out_dt == at::kFloat ? 1e-6 : 8e-3;
  double worst = 0;
  for (int p = 0; p < P; ++p)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = p * n + j;
      const double x = full[i].item<double>();
      const double unit = i >= P * n - 40 ? 0
                                          : unit_at(full, p * n, std::min((p + 1) * n, P * n - 40),
                                                    i, o.bucket_size, bits);
      worst = std::max(
          worst, std::fabs(out[i].item<double>() - x) / (unit / 2 + eps * (std::fabs(x) + 1)));
    }
  const std::string tag =
      tally::format("all-gather n=%ld bits=%d -> %s", long(n), bits, c10::toString(out_dt));
  tally::check(tag + ": every value within half a unit", worst <= 1,
               tally::format("worst err / bound %.3f (<= 1)", worst));
  const int64_t whole = int64_t(P) * P * n;  // every rank's gathered buffer
  at::Tensor all = at::empty({whole}, out_dt);
  g.allgather(all, out)->wait();
  bool same = true;
  for (int r = 0; r < P; ++r)
    same =
        same && std::memcmp(all.data_ptr(), static_cast<char*>(all.data_ptr()) + r * out.nbytes(),
                            out.nbytes()) == 0;
  tally::check(tag + ": every rank holds the same bits", same);
}

}  // namespace

int main() {
  try {
    auto g = lockstep::init();
    tally::rank = g->rank();
    for (int64_t n : {1L, 129L, 1000L})
      for (int bits : {4, 8}) check_reduce_scatter_bound(*g, n, bits, at::kFloat);
    check_reduce_scatter_bound(*g, 777, 4, at::kBFloat16);
    check_reduce_scatter_unbiased(*g);
    check_reduce_scatter_layers(*g);
    for (int64_t n : {200L, 1031L}) {
      check_allgather(*g, n, 8, at::kFloat);
      check_allgather(*g, n, 4, at::kBFloat16);
    }
    g->barrier()->wait();
    return tally::finish("/" + std::to_string(g->size()) + " [" + g->backend_name() + "]");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shard_compress_check: %s\n", e.what());
    return 1;
  }
}
