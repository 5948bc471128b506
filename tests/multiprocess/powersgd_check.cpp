// Multi-process check of the PowerSGD communication hook (any backend, 1..4 ranks):
//   - at rank >= min(n, m) it equals exact averaging (float64 and float32, stated bounds);
//   - error feedback: sum over steps of the applied averages + the ranks' final errors equals
//     the sum of the true averages (float64), and does not without error feedback;
//   - start_iter: the first steps equal the group's plain allreduce bit for bit;
//   - replicas hold identical bits after every step;
//   - warm start: a fixed gradient's approximation converges to the best rank-r one (Q is
//     carried from step to step), a cold start's does not.
// With --torch-ref DIR (2 ranks; DIR written by powersgd_torch_ref.py): the hook's results
// and errors on PyTorch's inputs equal what PyTorch's own powerSGD_hook produced.
// Exits non-zero on any failure.
#include <lockstep/lockstep.h>
#include <lockstep/parallel/ddp/hooks/powersgd_hook.h>

#include "tally.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using lockstep::ddp::CommHook;
using lockstep::ddp::GradBucket;
using lockstep::ddp::hooks::powersgd_hook;
using lockstep::ddp::hooks::PowerSgdOptions;
using lockstep::ddp::hooks::PowerSgdState;
using Shapes = std::vector<std::vector<int64_t>>;

namespace {

// A check on the tally (tally.h); on failure the printf-style detail says why.
#define EXPECT(cond, ...)                                    \
  do {                                                       \
    const bool ok_ = static_cast<bool>(cond);                \
    char why_[512] = "";                                     \
    if (!ok_) std::snprintf(why_, sizeof why_, __VA_ARGS__); \
    tally::check(#cond, ok_, why_);                          \
  } while (0)

int64_t numel_of(const Shapes& shapes) {
  int64_t total = 0;
  for (const auto& s : shapes) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    total += n;
  }
  return total;
}

GradBucket make_bucket(int64_t index, int64_t count, const Shapes& shapes, at::ScalarType dt,
                       int world) {
  GradBucket b;
  b.index = index;
  b.num_buckets = count;
  b.is_last = index + 1 == count;
  b.world_size = world;
  int64_t off = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t n = numel_of({shapes[i]});
    b.names.push_back("b" + std::to_string(index) + ".p" + std::to_string(i));
    b.offsets.push_back(off);
    b.numels.push_back(n);
    b.shapes.push_back(shapes[i]);
    b.param_indices.push_back(int64_t(i));
    off += n;
  }
  b.buffer = at::zeros({off}, at::TensorOptions().dtype(dt));
  return b;
}

// One bucket through the hook as DDP hands it over: this rank's raw gradient (rounded to the
// bucket's dtype) divided by the world size. Returns the result as float64.
at::Tensor reduce(CommHook& hook, lockstep::ProcessGroup& g, GradBucket& b, const at::Tensor& raw) {
  b.buffer.copy_(raw);
  b.buffer.mul_(1.0 / g.size());
  auto r = hook(g, b);
  r.work->wait();
  if (r.finish) r.finish();
  return b.buffer.to(at::kDouble);
}

// Rank r's raw gradient at `step`: closed form, so every rank knows every rank's.
at::Tensor gradient(int r, int step, int64_t n, double salt) {
  at::Tensor x = at::empty({n}, at::kDouble);
  double* p = x.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i)
    p[i] = std::sin(0.37 * double(i) + 1.3 * r + 0.71 * step + salt) * (1.0 + 0.25 * r) +
           0.1 * std::cos(0.05 * double(i * (r + 1)));
  return x;
}

at::Tensor mean_gradient(int world, int step, int64_t n, double salt, at::ScalarType dt) {
  at::Tensor s = at::zeros({n}, at::kDouble);
  for (int r = 0; r < world; ++r) s += gradient(r, step, n, salt).to(dt).to(at::kDouble);
  return s / world;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

// Every rank's copy of `t` bit-identical to rank 0's.
bool identical_on_ranks(lockstep::ProcessGroup& g, const at::Tensor& t) {
  at::Tensor all = at::empty({t.numel() * g.size()}, t.options());
  at::Tensor in = t.contiguous();
  g.allgather(all, in)->wait();
  for (int r = 1; r < g.size(); ++r)
    if (std::memcmp(all.narrow(0, 0, t.numel()).data_ptr(),
                    all.narrow(0, r * t.numel(), t.numel()).data_ptr(),
                    size_t(t.numel() * t.element_size())) != 0)
      return false;
  return true;
}

void check_full_rank_is_exact(lockstep::ProcessGroup& g, at::ScalarType dt, double tol) {
  const Shapes shapes{{6, 5}, {5}, {4, 3, 2}, {2, 9}, {9, 7}, {7, 2}};
  PowerSgdOptions o;
  o.matrix_approximation_rank = 9;  // >= min(n, m) of every matrix: QR for r > 2, GS below
  o.start_iter = 2;
  o.min_compression_rate = 0;  // compress everything, vectors included
  auto hook = powersgd_hook(o);
  GradBucket b = make_bucket(0, 1, shapes, dt, g.size());
  const int64_t n = numel_of(shapes);
  double worst = 0;
  for (int step = 0; step < 5; ++step) {
    at::Tensor out = reduce(hook, g, b, gradient(g.rank(), step, n, 0.0).to(dt));
    worst = std::max(worst, max_diff(out, mean_gradient(g.size(), step, n, 0.0, dt)));
    EXPECT(identical_on_ranks(g, b.buffer), "full rank, step %d: replicas differ", step);
  }
  EXPECT(worst <= tol, "full rank %s: max diff %g > %g", lockstep::comm::dtype_name(dt).c_str(),
         worst, tol);
  if (g.rank() == 0)
    std::printf("rank >= min(n, m), %s: max diff to the exact average %.3g (bound %g)\n",
                lockstep::comm::dtype_name(dt).c_str(), worst, tol);
}

// The first start_iter steps are the group's plain allreduce, bit for bit; later steps are
// compressed (they differ from the exact average), and replicas agree after every step.
void check_start_iter_and_replicas(lockstep::ProcessGroup& g) {
  const Shapes shapes{{16, 24}, {24}, {40, 6}};
  PowerSgdOptions o;
  o.start_iter = 3;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  GradBucket b = make_bucket(0, 1, shapes, at::kFloat, g.size());
  const int64_t n = numel_of(shapes);
  for (int step = 0; step < 6; ++step) {
    at::Tensor raw = gradient(g.rank(), step, n, 1.0).to(at::kFloat);
    at::Tensor plain = raw.clone();
    plain.mul_(1.0 / g.size());
    EXPECT(step < 3 ? state->bucket(0) == nullptr : true, "step %d: state before start", step);
    at::Tensor out = reduce(hook, g, b, raw);
    g.allreduce(plain)->wait();
    const bool same = std::memcmp(plain.data_ptr(), b.buffer.data_ptr(), size_t(n) * 4) == 0;
    if (step < 3)
      EXPECT(same, "step %d < start_iter: differs from the plain allreduce (max diff %g)", step,
             max_diff(out, plain.to(at::kDouble)));
    else
      EXPECT(max_diff(out, plain.to(at::kDouble)) > 1e-3,
             "step %d >= start_iter: equals the plain allreduce, nothing compressed?", step);
    EXPECT(identical_on_ranks(g, b.buffer), "step %d: replicas differ", step);
    EXPECT(state->iter() == step + 1, "iter %ld after step %d", long(state->iter()), step);
  }
  if (g.rank() == 0)
    std::printf(
        "start_iter: plain allreduce bit for bit before it, compressed after; replicas "
        "identical every step\n");
}

// Telescoping error feedback (float64): sum_k applied_k + sum_ranks error_K = sum_k mean_k.
double feedback_residual(lockstep::ProcessGroup& g, bool feedback) {
  const std::vector<Shapes> buckets{{{16, 24}, {24}, {8, 4, 3}}, {{40, 6}, {10}}};
  PowerSgdOptions o;
  o.start_iter = 2;
  o.use_error_feedback = feedback;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  double worst = 0;
  std::vector<at::Tensor> applied, truth;
  std::vector<GradBucket> bs;
  for (size_t i = 0; i < buckets.size(); ++i) {
    bs.push_back(
        make_bucket(int64_t(i), int64_t(buckets.size()), buckets[i], at::kDouble, g.size()));
    applied.push_back(at::zeros({numel_of(buckets[i])}, at::kDouble));
    truth.push_back(applied.back().clone());
  }
  for (int step = 0; step < 8; ++step)
    for (size_t i = 0; i < bs.size(); ++i) {
      const int64_t n = numel_of(buckets[i]);
      applied[i] += reduce(hook, g, bs[i], gradient(g.rank(), step, n, double(i)));
      truth[i] += mean_gradient(g.size(), step, n, double(i), at::kDouble);
    }
  for (size_t i = 0; i < bs.size(); ++i) {
    const at::Tensor& kept = state->bucket(int64_t(i))->error;  // error / world size
    at::Tensor err = kept.defined() ? kept.clone() : at::zeros_like(applied[i]);
    EXPECT(kept.defined() == feedback, "bucket %zu: error kept %d", i, int(kept.defined()));
    g.allreduce(err)->wait();
    worst = std::max(worst, max_diff(applied[i] + err, truth[i]));
  }
  return worst;
}

void check_error_feedback(lockstep::ProcessGroup& g) {
  const double with = feedback_residual(g, true), without = feedback_residual(g, false);
  EXPECT(with <= 1e-10, "error feedback: sum of applied + errors vs true sum: max diff %g", with);
  EXPECT(without > 1e-3, "without error feedback the residual is %g: the test cannot tell",
         without);
  if (g.rank() == 0)
    std::printf(
        "error feedback: applied + final errors = true sum, max diff %.3g (bound 1e-10; "
        "%.3g without feedback)\n",
        with, without);
}

// Rank 1 on the same gradient every step, no error feedback: with warm start each step is
// one more subspace iteration from the carried Q, so the error reaches the best rank-1 one.
double warm_start_error(lockstep::ProcessGroup& g, bool warm, double* best) {
  const int64_t n = 20, m = 12;
  at::Tensor u = std::get<0>(at::linalg_qr(gradient(7, 0, n * 3, 0.5).view({n, 3})));
  at::Tensor v = std::get<0>(at::linalg_qr(gradient(8, 0, m * 3, 0.25).view({m, 3})));
  at::Tensor s = at::tensor({3.0, 2.4, 0.3}, at::kDouble);
  at::Tensor mean = at::mm(u * s, v.t());
  at::Tensor raw = mean + (g.rank() - 0.5 * (g.size() - 1)) * 0.01 *
                              gradient(g.rank(), 1, n * m, 0).view({n, m});
  at::Tensor truth = raw.clone();
  g.allreduce(truth)->wait();
  truth /= g.size();
  at::Tensor sv = at::linalg_svdvals(truth);  // the best rank-1 error: the rest's norm
  *best = sv.narrow(0, 1, sv.numel() - 1).pow(2).sum().sqrt().item<double>();
  PowerSgdOptions o;
  o.start_iter = 2;  // the least PyTorch allows with warm start
  o.use_error_feedback = false;
  o.warm_start = warm;
  auto hook = powersgd_hook(o);
  GradBucket b = make_bucket(0, 1, {{n, m}}, at::kDouble, g.size());
  at::Tensor out;
  for (int step = 0; step < 42; ++step) out = reduce(hook, g, b, raw.reshape({-1}));
  return (out - truth.reshape({-1})).pow(2).sum().sqrt().item<double>();
}

void check_warm_start(lockstep::ProcessGroup& g) {
  double best = 0;
  const double warm = warm_start_error(g, true, &best), cold = warm_start_error(g, false, &best);
  EXPECT(warm <= best * (1 + 1e-9), "warm start: error %.12g, best rank-1 error %.12g", warm, best);
  EXPECT(cold > best * 1.01, "cold start: error %.12g within 1%% of the best %.12g", cold, best);
  if (g.rank() == 0)
    std::printf("warm start: error %.9g = best rank-1 %.9g after 42 steps; cold start %.6g\n", warm,
                best, cold);
}

// --- PyTorch's hook (powersgd_torch_ref.py) --------------------------------------------

struct TorchCase {
  const char* name;
  at::ScalarType dt;
  int64_t rank, start;
  bool feedback, warm;
  double rate;
  uint32_t seed;
  int steps;
  double tol;  // max abs difference allowed (values are ~N(0, 1))
};

const std::vector<Shapes>& torch_buckets() {
  static const std::vector<Shapes> b{{{16, 24}, {24}, {8, 4, 3}, {10}, {40, 6}},
                                     {{12, 12}, {7, 5}, {12, 12}, {3}}};
  return b;
}

std::vector<double> read_doubles(const std::string& path, size_t count) {
  std::ifstream f(path, std::ios::binary);
  std::vector<double> v(count);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(count * sizeof(double)));
  if (!f || f.peek() != EOF)
    throw lockstep::Error(path + ": not " + std::to_string(count) +
                          " float64 values; regenerate it with powersgd_torch_ref.py");
  return v;
}

void check_against_torch(lockstep::ProcessGroup& g, const std::string& dir, const TorchCase& c) {
  const auto& shapes = torch_buckets();
  int64_t total = 0;
  for (const auto& s : shapes) total += numel_of(s);
  const int W = g.size();
  auto in = read_doubles(dir + "/" + c.name + ".inputs.bin", size_t(int64_t(W) * c.steps * total));
  auto out = read_doubles(dir + "/" + c.name + ".outputs.bin", size_t(c.steps * total));
  auto err = read_doubles(dir + "/" + c.name + ".errors.bin", size_t(W * total));
  PowerSgdOptions o;
  o.matrix_approximation_rank = c.rank;
  o.start_iter = c.start;
  o.use_error_feedback = c.feedback;
  o.warm_start = c.warm;
  o.min_compression_rate = c.rate;
  o.random_seed = c.seed;
  auto state = std::make_shared<PowerSgdState>(o);
  auto hook = powersgd_hook(state);
  std::vector<GradBucket> bs;
  for (size_t i = 0; i < shapes.size(); ++i)
    bs.push_back(make_bucket(int64_t(i), int64_t(shapes.size()), shapes[i], c.dt, W));
  auto d = at::TensorOptions().dtype(at::kDouble);
  double worst = 0, worst_err = 0;
  for (int step = 0; step < c.steps; ++step) {
    int64_t at_ = 0;
    for (size_t i = 0; i < bs.size(); ++i) {
      const int64_t n = bs[i].buffer.numel();
      const double* src = in.data() + (int64_t(g.rank()) * c.steps + step) * total + at_;
      at::Tensor raw = at::from_blob(const_cast<double*>(src), {n}, d).to(c.dt);
      at::Tensor mine = reduce(hook, g, bs[i], raw);
      at::Tensor theirs = at::from_blob(out.data() + step * total + at_, {n}, d);
      worst = std::max(worst, max_diff(mine, theirs));
      at_ += n;
    }
  }
  int64_t at_ = 0;
  for (size_t i = 0; i < bs.size(); ++i) {
    const int64_t n = bs[i].buffer.numel();
    at::Tensor theirs = at::from_blob(err.data() + int64_t(g.rank()) * total + at_, {n}, d) / W;
    worst_err =
        std::max(worst_err, max_diff(state->bucket(int64_t(i))->error.to(at::kDouble), theirs));
    at_ += n;
  }
  EXPECT(worst <= c.tol, "%s: max diff to PyTorch's results %g > %g", c.name, worst, c.tol);
  EXPECT(worst_err <= c.tol, "%s: max diff to PyTorch's errors / W %g > %g", c.name, worst_err,
         c.tol);
  if (g.rank() == 0)
    std::printf(
        "%s: against PyTorch's powerSGD_hook, max diff of results %.3g, of errors %.3g "
        "(bound %g)\n",
        c.name, worst, worst_err, c.tol);
}

void check_torch(lockstep::ProcessGroup& g, const std::string& dir) {
  if (g.size() != 2) throw lockstep::Error("--torch-ref needs 2 ranks (the reference's)");
  // The same cases as powersgd_torch_ref.py's CASES.
  const std::vector<TorchCase> cases{
      {"gs_warm_f64", at::kDouble, 2, 2, true, true, 2.0, 0, 6, 1e-12},
      {"qr_cold_f32", at::kFloat, 4, 2, true, false, 2.0, 7, 5, 1e-5},
      {"rank1_rate1_f64", at::kDouble, 1, 3, true, true, 0.5, 123, 6, 1e-12},
  };
  for (const auto& c : cases) check_against_torch(g, dir, c);
}

// Ranks with different ranks r: CommError(Mismatch) on every rank at the first compressed
// step (the composite op's fingerprint), not garbled sums.
int check_mismatch(lockstep::ProcessGroup& g) {
  PowerSgdOptions o;
  o.start_iter = 2;
  o.matrix_approximation_rank = 1 + g.rank();
  auto hook = powersgd_hook(o);
  GradBucket b = make_bucket(0, 1, {{16, 24}}, at::kFloat, g.size());
  const at::Tensor raw = gradient(g.rank(), 0, 384, 0).to(at::kFloat);
  for (int step = 0; step < 3; ++step) {
    try {
      reduce(hook, g, b, raw);
    } catch (const lockstep::CommError& e) {
      const bool ok = step == 2 && e.kind() == lockstep::CommError::Kind::Mismatch;
      std::printf("rank %d, step %d: %s: %s\n", g.rank(), step, ok ? "expected" : "WRONG",
                  e.what());
      return ok ? 0 : 1;
    }
  }
  std::fprintf(stderr, "rank %d: different ranks r were not detected\n", g.rank());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto g = lockstep::init();
    tally::rank = g->rank();
    if (argc == 2 && std::string(argv[1]) == "--mismatch") return check_mismatch(*g);
    if (argc == 3 && std::string(argv[1]) == "--torch-ref") {
      check_torch(*g, argv[2]);
    } else {
      check_full_rank_is_exact(*g, at::kDouble, 1e-10);
      check_full_rank_is_exact(*g, at::kFloat, 2e-5);
      check_start_iter_and_replicas(*g);
      check_error_feedback(*g);
      check_warm_start(*g);
    }
    g->barrier()->wait();
    return tally::finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "powersgd_check: %s\n", e.what());
    return 1;
  }
}
