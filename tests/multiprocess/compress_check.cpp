// Multi-process check of the compressed allreduce: closed-form sums within the stated
// bound, bit-identical replicas, odd sizes, dtypes, plain layers, NaN reporting.
// Run under lockstep-run (any backend, 1..4 ranks); exits non-zero on any failure.
#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/lockstep.h>
#include <lockstep/parallel/ddp/hooks/qsgd_hook.h>

#include "compress/device_exchange.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tally.h"

using namespace lockstep::compress;

namespace {

// Rank r's input, known to every rank so the expected sum is closed form.
float input(int r, int64_t i) {
  return std::sin(0.37f * float(i) + float(r)) * (1.0f + 0.5f * float(r));
}

// Rank r's input rounded to dtype and back (computed once per rank: the closed-form
// reference must not dominate the test's time).
std::vector<float> rounded_input(int r, int64_t n, at::ScalarType dt) {
  at::Tensor x = at::empty({n}, at::kFloat);
  float* p = x.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = input(r, i);
  at::Tensor y = x.to(dt).to(at::kFloat).contiguous();
  return std::vector<float>(y.data_ptr<float>(), y.data_ptr<float>() + n);
}

double bucket_unit(const std::vector<float>& v, int64_t lo_i, int64_t hi_i, int bits) {
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = lo_i; i < hi_i; ++i)
    lo = std::min(lo, v[size_t(i)]), hi = std::max(hi, v[size_t(i)]);
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
  {
    float* p_ = x.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i);
  }
  at::Tensor t = x.to(dt);
  CompressedAllreduce plan(o, {{"w", 0, n}}, n, P);
  plan.run(g, t, average);
  // Expected: sum of every rank's (dtype-rounded) input; bound per bucket: one unit of
  // each sender's bucket (quantization #1) + one unit of the sum (quantization #2),
  // plus the output dtype's rounding.
  double worst = 0, max_err = 0;
  std::string over;  // the first element over its bound, if any
  const int L = (1 << bits) - 1;
  std::vector<std::vector<float>> in;
  in.reserve(size_t(P));
  for (int r = 0; r < P; ++r) in.push_back(rounded_input(r, n, dt));
  const at::Tensor got_all = t.to(at::kFloat).contiguous();
  const float* got_p = got_all.data_ptr<float>();
  for (int64_t b = 0; b < n; b += o.bucket_size) {
    const int64_t e = std::min(n, b + o.bucket_size);
    double u1 = 0;
    for (int r = 0; r < P; ++r) u1 += bucket_unit(in[size_t(r)], b, e, bits);
    double lo = INFINITY, hi = -INFINITY;
    std::vector<double> exact;
    for (int64_t i = b; i < e; ++i) {
      double s = 0;
      for (int r = 0; r < P; ++r) s += in[size_t(r)][size_t(i)];
      if (average) s /= P;
      exact.push_back(s);
      lo = std::min(lo, s), hi = std::max(hi, s);
    }
    const double scale = average ? 1.0 / P : 1.0;
    const double u2 = (hi - lo + 2 * u1 * scale) / L;
    const double dt_eps = dt == at::kFloat ? 1e-6 : (dt == at::kHalf ? 1e-3 : 8e-3);
    for (int64_t i = b; i < e; ++i) {
      const double got = got_p[i];
      const double err = std::fabs(got - exact[size_t(i - b)]);
      const double bound = P == 1 ? 0 : u1 * scale + u2;
      const double slack = dt_eps * (std::fabs(exact[size_t(i - b)]) + 1) + 1e-5;
      max_err = std::max(max_err, err);
      if (bound > 0) worst = std::max(worst, (err - slack) / bound);
      if (!(err <= bound + slack) && over.empty())
        over = tally::format("i=%ld err %.3g bound %.3g slack %.3g", long(i), err, bound, slack);
    }
  }
  const std::string tag = tally::format("n=%ld bits=%d %s %s", long(n), bits, c10::toString(dt),
                                        average ? "avg" : "sum");
  tally::check(tag + ": every element within its bound", over.empty(),
               over.empty() ? tally::format("max err %.3g, worst (err-slack)/bound %.3f (<= 1)",
                                            max_err, worst)
                            : over);
  // Every replica must hold identical bits. (n == 0: nothing to compare; the gloo
  // backend of lockstep_comm also rejects 0-element allgathers at the time of writing.)
  if (n == 0) return;
  at::Tensor all = at::empty({P * n}, t.options());
  g.allgather(all, t)->wait();
  for (int r = 0; r < P; ++r)
    tally::check(
        tag + tally::format(": replica %d holds rank 0's bits", r),
        std::memcmp(all.data_ptr(), static_cast<char*>(all.data_ptr()) + r * n * t.element_size(),
                    size_t(n * t.element_size())) == 0);
}

void check_mixed_layers_and_nan(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  // weight (compressed), bias (plain: excluded), small (plain: under min_layer), hole.
  std::vector<LayerSpan> layers{{"a.weight", 0, 3000},
                                {"a.bias", 3000, 64},
                                {"b.weight", 3064, 2049},
                                {"c.weight", 5200, 100}};
  const int64_t n = 5400;
  QsgdOptions o;  // defaults: 4 bits, exclude bias/norm, min_layer 1024
  at::Tensor t = at::empty({n}, at::kFloat);
  {
    float* p_ = t.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i);
  }
  CompressedAllreduce plan(o, layers, n, P);
  plan.run(g, t, /*average=*/true);
  // Plain parts are exact averages (up to float summation order).
  for (int64_t i : {3000L, 3063L, 5200L, 5299L, 5150L, 5399L}) {
    double s = 0;
    for (int r = 0; r < P; ++r) s += input(r, i);
    const double got = t[i].item<double>();
    tally::check(tally::format("plain element %ld is the exact average", long(i)),
                 std::fabs(got - s / P) < 1e-5, tally::format("%g vs %g", got, s / P));
  }
  // NaN on the last rank in b.weight: every rank raises, naming the layer.
  {
    float* p_ = t.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i);
  }
  if (me == P - 1) t[4000] = NAN;
  std::string named;
  try {
    plan.run(g, t, true);
  } catch (const NonFiniteGradient& e) {
    named = e.layer();
    if (me == 0) std::printf("NaN reported on every rank: %s\n", e.what());
  }
  tally::check("NaN: NonFiniteGradient names b.weight", named == "b.weight", "got '" + named + "'");
  // Inf in a plain layer is reported too.
  {
    float* p_ = t.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i);
  }
  if (me == 0) t[3010] = INFINITY;
  named.clear();
  try {
    plan.run(g, t, true);
  } catch (const NonFiniteGradient& e) {
    named = e.layer();
  }
  tally::check("Inf in a plain layer: NonFiniteGradient names a.bias", named == "a.bias",
               "got '" + named + "'");
}

// The allgather of encodings (src/compress/device_exchange.h, CompressedAllreduce's path
// for CUDA buffers) run on CPU tensors with the CPU codec, the same bytes: plain layers
// exact, compressed ones within one unit of the bucket per rank, replicas bit-identical,
// NaN named on every rank.
void check_device_exchange_algorithm(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  if (P == 1) return;  // CompressedAllreduce takes it only across ranks
  std::vector<LayerSpan> layers{
      {"small", 0, 500}, {"a", 500, 2500}, {"<unnamed>", 3000, 500}, {"b", 3500, 5000}};
  DeviceExchange ex(layers, {false, true, false, true}, QsgdOptions{});
  const int64_t n = 8500;
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const std::vector<float> mine = rounded_input(me, n, dt);
    at::Tensor t = at::from_blob(const_cast<float*>(mine.data()), {n}).to(dt);
    ex.issue(g, t, /*step=*/5)->wait();
    tally::check("device exchange: no NaN reported", ex.finish(/*average=*/true) == -1);
    std::vector<std::vector<float>> all(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) all[size_t(r)] = rounded_input(r, n, dt);
    const at::Tensor got = t.to(at::kFloat);
    const float* y = got.data_ptr<float>();
    double plain = 0, excess = 0;
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int r = 0; r < P; ++r) s += all[size_t(r)][size_t(i)];
      const double d = std::fabs(y[i] - s / P);
      if (i < 500 || (i >= 3000 && i < 3500)) {
        plain = std::max(plain, d);
      } else {  // one unit of its bucket per rank, averaged, plus the dtype's rounding
        const int64_t lo = i < 3000 ? 500 + (i - 500) / 128 * 128 : 3500 + (i - 3500) / 128 * 128;
        const int64_t hi = std::min(lo + 128, i < 3000 ? int64_t(3000) : n);
        double bound = 0;
        for (int r = 0; r < P; ++r) bound += bucket_unit(all[size_t(r)], lo, hi, 4);
        excess = std::max(excess, d - (bound / P + 0.01 * std::fabs(s / P) + 1e-6));
      }
    }
    const std::string dn = dt == at::kFloat ? "float32" : "bfloat16";
    tally::check("device exchange " + dn + ": plain layers exact",
                 plain <= (dt == at::kFloat ? 1e-6 : 0.01), tally::format("max diff %g", plain));
    tally::check("device exchange " + dn + ": compressed within one unit a rank", excess <= 0,
                 tally::format("excess %g", excess));
    at::Tensor root = got.clone();
    g.broadcast(root, {0})->wait();
    tally::check("device exchange " + dn + ": replicas bit-identical", at::equal(root, got));
  }
  std::vector<float> mine = rounded_input(me, n, at::kFloat);
  if (me == P - 1) mine[4000] = NAN;
  at::Tensor t = at::from_blob(mine.data(), {n});
  ex.issue(g, t, 6)->wait();
  const int bad = ex.finish(true);
  tally::check("device exchange: a NaN on the last rank names layer 'b' everywhere", bad == 3,
               tally::format("layer %d", bad));
}

// Several plans in flight at once (as DDP buckets are): issue all, then wait; the results,
// pipelined in many rounds, must equal the blocking one-round path's bits, and a plain collective
// issued in between from the same thread must not disturb the composites' order.
void check_async_overlap(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  QsgdOptions o;
  o.seed = 11;
  o.min_layer = 0;
  const std::vector<int64_t> sizes{5000, 129, 70001};
  std::vector<std::unique_ptr<CompressedAllreduce>> a, b;
  std::vector<at::Tensor> xa, xb;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    std::vector<LayerSpan> layers{{"w" + std::to_string(k), 0, n - 3}, {"bias", n - 3, 3}};
    QsgdOptions serial = o, piped = o;
    serial.pipeline_chunk = 0;   // one round
    piped.pipeline_chunk = 700;  // up to 16 rounds, helper thread: same values expected
    a.push_back(std::make_unique<CompressedAllreduce>(serial, layers, n, P));
    b.push_back(std::make_unique<CompressedAllreduce>(piped, layers, n, P));
    at::Tensor t = at::empty({n}, at::kFloat);
    {
      float* p_ = t.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i + 1000 * int64_t(k));
    }
    xa.push_back(t.clone());
    xb.push_back(t.clone());
  }
  for (size_t k = 0; k < sizes.size(); ++k) a[k]->run(g, xa[k], true);
  std::vector<lockstep::comm::WorkPtr> works;
  at::Tensor extra = at::full({10}, float(me + 1));
  for (size_t k = 0; k < sizes.size(); ++k) {
    works.push_back(b[k]->run_async(g, xb[k], true));
    if (k == 0) works.push_back(g.allreduce(extra));
  }
  for (auto& w : works) w->wait();
  for (size_t k = 0; k < sizes.size(); ++k) {
    b[k]->finish();
    tally::check(
        tally::format("async pipelined result %zu (%d rounds) == the blocking one-round one", k,
                      b[k]->rounds()),
        at::equal(xa[k], xb[k]),
        tally::format("max diff %g", (xa[k] - xb[k]).abs().max().item<double>()));
  }
  tally::check("interleaved allreduce", extra[0].item<float>() == float(P * (P + 1)) / 2,
               tally::format("%g", double(extra[0].item<float>())));
}

// One pipelined plan over several calls (its helper thread reused, the error-feedback
// residual carried from call to call, and updated on the helper) against a one-round plan:
// the same bits at every step.
void check_pipelined_steps(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  const int64_t n = 20011;
  QsgdOptions o;
  o.seed = 5;
  o.min_layer = 0;
  o.error_feedback = true;
  QsgdOptions serial = o, piped = o;
  serial.pipeline_chunk = 0;
  piped.pipeline_chunk = 1000;
  const std::vector<LayerSpan> layers{{"w", 0, n - 11}, {"bias", n - 11, 11}};
  CompressedAllreduce a(serial, layers, n, P), b(piped, layers, n, P);
  tally::check("one round, and several pipelined", a.rounds() == 1 && (P == 1 || b.rounds() > 1),
               tally::format("rounds %d and %d", a.rounds(), b.rounds()));
  for (int step = 0; step < 4; ++step) {
    at::Tensor x = at::empty({n}, at::kFloat);
    {
      float* p_ = x.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i + 31 * int64_t(step));
    }
    at::Tensor y = x.clone();
    const auto sa = a.run(g, x, step % 2 == 0).seconds;
    const auto sb = b.run(g, y, step % 2 == 0).seconds;
    tally::check(tally::format("step %d: pipelined (%d rounds) == one round", step, b.rounds()),
                 at::equal(x, y), tally::format("max diff %g", (x - y).abs().max().item<double>()));
    // Where the time went (AllreduceStats::seconds): every phase of a call that crossed a
    // link took some time (the bias goes in the plain allreduce), one-round and pipelined.
    // On hier only the local rank whose share holds the bias has a plain phase.
    const bool shares = g.backend_name() == "hier";
    for (const auto& s : {sa, sb})
      tally::check(tally::format("step %d: every phase took time", step),
                   P == 1 || (s.encode > 0 && s.alltoall > 0 && s.reduce > 0 && s.reencode > 0 &&
                              s.allgather > 0 && s.decode > 0 && (s.plain > 0 || shares)),
                   tally::format("seconds encode %g alltoall %g reduce %g reencode %g allgather %g "
                                 "decode %g plain %g",
                                 s.encode, s.alltoall, s.reduce, s.reencode, s.allgather, s.decode,
                                 s.plain));
  }
}

// The DDP hook (composite op, async) and the direct path give identical bits, step after
// step (same seed, same step counter); NaN through the hook is raised by its finish step
// on every rank and leaves the group usable.
void check_hook_matches_direct(lockstep::ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  QsgdOptions o;
  o.seed = 3;
  o.use_env = false;
  lockstep::ddp::GradBucket bk;
  bk.index = 0;
  bk.num_buckets = 1;
  bk.is_last = true;
  bk.world_size = P;
  bk.names = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  bk.offsets = {0, 4096, 4160, 14160};
  bk.numels = {4096, 64, 10000, 10};
  bk.shapes = {{64, 64}, {64}, {10, 1000}, {10}};
  bk.param_indices = {0, 1, 2, 3};
  const int64_t n = 14170;
  bk.buffer = at::empty({n}, at::kFloat);
  auto hook = lockstep::ddp::hooks::qsgd(o);
  std::vector<LayerSpan> spans;
  for (size_t i = 0; i < bk.names.size(); ++i)
    spans.push_back({bk.names[i], bk.offsets[i], bk.numels[i]});
  CompressedAllreduce direct(o, spans, n, P);
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::empty({n}, at::kFloat);
    {
      float* p_ = x.data_ptr<float>();
      for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i + 17 * int64_t(step)) / float(P);
    }
    bk.buffer.copy_(x);
    auto r = hook(g, bk);
    r.work->wait();
    if (r.finish) r.finish();
    direct.run(g, x, /*average=*/false);
    tally::check(tally::format("step %d: hook == direct path, bit for bit", step),
                 std::memcmp(x.data_ptr(), bk.buffer.data_ptr(), size_t(n) * 4) == 0,
                 tally::format("max diff %g", (x - bk.buffer).abs().max().item<double>()));
    tally::check(tally::format("step %d: hook bytes == direct path bytes", step),
                 r.bytes == direct.last_stats().bytes_sent,
                 tally::format("%ld vs %ld", long(r.bytes), long(direct.last_stats().bytes_sent)));
  }
  {
    float* p_ = bk.buffer.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p_[i] = input(me, i);
  }
  if (me == 0) bk.buffer[5000] = NAN;
  std::string named;
  auto r = hook(g, bk);
  try {
    r.work->wait();
    if (r.finish) r.finish();
  } catch (const NonFiniteGradient& e) {
    named = e.layer();
  }
  tally::check("hook: NaN: NonFiniteGradient names fc2.weight", named == "fc2.weight",
               "got '" + named + "'");
  g.barrier()->wait();  // the group survived the NaN report
}

}  // namespace

int main() {
  try {
    auto g = lockstep::init();
    tally::rank = g->rank();
    for (int64_t n : {0L, 1L, 127L, 128L, 129L, 1000L, 4099L, 100003L})
      for (int bits : {2, 4, 8}) check_case(*g, n, bits, at::kFloat, false);
    check_case(*g, 50001, 1, at::kFloat, true);
    check_case(*g, 4099, 4, at::kBFloat16, true);
    check_case(*g, 4099, 8, at::kHalf, false);
    check_mixed_layers_and_nan(*g);
    check_device_exchange_algorithm(*g);
    check_async_overlap(*g);
    check_pipelined_steps(*g);
    check_hook_matches_direct(*g);
    g->barrier()->wait();
    return tally::finish("/" + std::to_string(g->size()) + " [" + g->backend_name() + "]");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compress_check: %s\n", e.what());
    return 1;
  }
}
