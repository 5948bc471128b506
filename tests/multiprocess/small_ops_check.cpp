// Small collectives back to back: the latency paths of the shm backend (the one-handshake
// allreduce, spin-then-futex waits) and of the ProcessGroup (ops queued without waking
// the comm thread and run by the waiting thread; see process_group.cpp).
//
// Every rank checks every result exactly: rank r contributes (r+1) * f(i) with
// f(i) = i % 7 + 1, small integers, so sums, maxima and averages are exact in every
// dtype used. Sizes vary from op to op across the small-path limit (64 KiB) and back,
// so consecutive ops alternate between the small slots and the staging buffers.
//   - sync:    ~1500 ops, each waited at once (run by the waiting thread);
//   - batches: 8 ops issued, then all waited (the comm thread runs most of them);
//   - async:   one small op that nobody waits on must still complete (the comm
//              thread's poll takes it), checked with is_completed() only.
// Launched by ctest through lockstep-run with 2-4 ranks (shm, and gloo as a reference).
#include "tally.h"

#include <lockstep/lockstep.h>

#include <ATen/ATen.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

using lockstep::comm::ReduceOp;

at::Tensor f_times(double scale, int64_t n, at::ScalarType t) {
  auto i = at::arange(0, n, at::kLong);
  return ((i.remainder(7) + 1).to(at::kDouble) * scale).to(t);
}

struct Case {
  int64_t n;
  at::ScalarType dtype;
  ReduceOp op;
};

// Op k of the sequence: sizes around the small-path limit (16384 float32 = 64 KiB).
Case case_of(int k) {
  static const int64_t sizes[] = {1, 2, 3, 7, 64, 255, 1024, 4095, 16384, 16385, 8192, 9000, 2};
  static const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kInt};
  static const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg, ReduceOp::Min};
  const int64_t n = sizes[k % 13];
  const at::ScalarType t = types[(k / 13) % 3];
  ReduceOp op = ops[(k / 39) % 4];
  if (op == ReduceOp::Avg && t == at::kInt) op = ReduceOp::Sum;
  // float64 at 16384 elements is 128 KiB: above the limit as well
  return Case{n, t, op};
}

double scale_of(ReduceOp op, int p) {
  const double tri = p * (p + 1) / 2.0;
  switch (op) {
    case ReduceOp::Sum:
      return tri;
    case ReduceOp::Avg:
      return tri / p;
    case ReduceOp::Max:
      return p;
    default:
      return 1;
  }
}

// One op issued; its tensor and what it must hold afterwards.
struct Issued {
  lockstep::comm::WorkPtr work;
  at::Tensor x;
  Case c;
};

Issued issue(lockstep::ProcessGroup& pg, int k) {
  const Case c = case_of(k);
  Issued i{nullptr, f_times(pg.rank() + 1, c.n, c.dtype), c};
  i.work = pg.allreduce(i.x, {c.op});
  return i;
}

// Exact comparison; counts the first few mismatches as failures with their max diff.
bool matches(const Issued& i, int p) {
  const at::Tensor want = f_times(scale_of(i.c.op, p), i.c.n, i.c.dtype);
  return at::equal(i.x, want);
}

void report(const std::string& what, int bad, int total, double worst) {
  tally::check(what, bad == 0,
               std::to_string(total - bad) + "/" + std::to_string(total) +
                   " exact, max |result - reference| = " + std::to_string(worst));
}

double diff(const Issued& i, int p) {
  const at::Tensor want = f_times(scale_of(i.c.op, p), i.c.n, i.c.dtype);
  return (i.x.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
}

void sync_ops(lockstep::ProcessGroup& pg, int count) {
  int bad = 0;
  double worst = 0;
  for (int k = 0; k < count; ++k) {
    Issued i = issue(pg, k);
    i.work->wait();
    if (!matches(i, pg.size())) ++bad, worst = std::max(worst, diff(i, pg.size()));
    if (k % 97 == 0) pg.barrier()->wait();  // barriers between them, on the same paths
  }
  report("sync: small allreduces, each waited at once", bad, count, worst);
}

void batches(lockstep::ProcessGroup& pg, int rounds) {
  int bad = 0, total = 0;
  double worst = 0;
  for (int b = 0; b < rounds; ++b) {
    std::vector<Issued> batch;
    for (int j = 0; j < 8; ++j) batch.push_back(issue(pg, b * 8 + j));
    for (auto& i : batch) {
      i.work->wait();
      ++total;
      if (!matches(i, pg.size())) ++bad, worst = std::max(worst, diff(i, pg.size()));
    }
  }
  report("batches: 8 small allreduces in flight, then waited", bad, total, worst);
}

// Rank 0 never calls wait(): its comm thread must still run the op (the others wait).
void unwaited(lockstep::ProcessGroup& pg) {
  Issued i = issue(pg, 4);  // 64 float32: queued without a wake on shm
  bool done = pg.rank() != 0;
  if (pg.rank() == 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!(done = i.work->is_completed()) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  i.work->wait();
  tally::check("async: an op nobody waits on completes (is_completed)", done);
  tally::check("async: its result is exact", matches(i, pg.size()));
}

}  // namespace

int main() {
  auto pg = lockstep::init();
  tally::rank = pg->rank();
  const auto t0 = std::chrono::steady_clock::now();
  sync_ops(*pg, 1500);
  batches(*pg, 40);
  unwaited(*pg);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank %d: %d ops in %.2f s\n", pg->rank(), 1500 + 320 + 1, s);
  return tally::finish();
}
