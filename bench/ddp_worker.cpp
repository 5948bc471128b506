// lockstep-bench ddp --worker: one rank of the lockstep DDP step benchmark.
//
// Times forward / backward / optimizer of every step (no barrier between steps, as in
// training), reads StepStats after each, checks that all replicas end identical, times
// backward under no_sync() (compute only, same contention), and with --profile the
// step's components in isolation. Rank 0 prints "RESULT key value" lines (seconds).
#include "bench_util.h"
#include "ddp_bench.h"
#include "jobs.h"

#include <lockstep/comm/host_cache.h>
#include <lockstep/lockstep.h>
#include <lockstep/models/mlp.h>
#include <lockstep/numerics/autocast.h>
#include <lockstep/parallel/ddp/ddp.h>

#include <torch/torch.h>

#include <cstdio>
#include <vector>

namespace lockstep::bench {
namespace {

// True if `v` is the same on every rank.
bool same_everywhere(ProcessGroup& g, double v) {
  return reduced_over_ranks(g, v, comm::ReduceOp::Min) == reduced_over_ranks(g, v);
}

// Median seconds of fn over `n` runs (after one warm-up), all ranks starting together.
double timed(ProcessGroup& g, int n, const std::function<void()>& fn) {
  return median(time_runs(fn, &g, {.warmup = 1, .min_iters = n, .max_iters = n, .min_seconds = 0}));
}

// fc1's weight gradient, the only compute left in backward once fc2's 67 MB bucket is
// launched: alone, and while that allreduce runs on the comm thread.
void profile_fc1_overlap(ProcessGroup& g, int n) {
  const int me = g.rank();
  at::Tensor gy = at::randn({64, 4096}), x = at::randn({64, 1024}), dw = at::empty({4096, 1024});
  report_result(me, "prof_fc1_dw", timed(g, n, [&] { at::mm_out(dw, gy.t(), x); }));
  at::Tensor big = at::randn({4096 * 4096 + 4096 + 4096 * 10 + 10});
  std::vector<double> ds;
  for (int i = 0; i < n; ++i) {
    g.barrier()->wait();
    auto w = g.allreduce(big);
    const double t0 = now_s();
    at::mm_out(dw, gy.t(), x);
    ds.push_back(now_s() - t0);
    w->wait();
  }
  report_result(me, "prof_fc1_dw_overlap", median(ds));
}

template <class DDP>
void profile(ProcessGroup& g, DDP& ddp, torch::optim::SGD& opt) {
  const int n = 7, me = g.rank();
  std::vector<at::Tensor> params = ddp.parameters();
  int64_t total = 0;
  for (auto& p : params) total += p.numel();
  at::Tensor flat = at::randn({total}), other = at::empty({total});
  report_result(me, "prof_allreduce_all", timed(g, n, [&] { g.allreduce(flat)->wait(); }));
  // The buckets' sizes in private copies, then DDP's own buffers (on shm in memory every
  // rank maps: the zero-copy allreduce the step runs; the gradients in them are spent).
  std::vector<at::Tensor> copies, own;
  for (const auto& b : ddp.reducer().buckets()) {
    copies.push_back(b.buffer.clone());
    own.push_back(b.buffer);
  }
  auto all_of = [&](std::vector<at::Tensor>& bufs) {
    std::vector<comm::WorkPtr> w;
    w.reserve(bufs.size());
    for (auto& b : bufs) w.push_back(g.allreduce(b));
    for (auto& x : w) x->wait();
  };
  report_result(me, "prof_allreduce_buckets", timed(g, n, [&] { all_of(copies); }));
  report_result(me, "prof_allreduce_in_place", timed(g, n, [&] { all_of(own); }));
  report_result(me, "prof_mul_out", timed(g, n, [&] { at::mul_out(other, flat, 0.5); }));
  report_result(me, "prof_copy", timed(g, n, [&] { other.copy_(flat); }));
  report_result(me, "prof_zero_grad", timed(g, n, [&] { opt.zero_grad(); }));
  report_result(me, "prof_sgd", timed(g, n, [&] {
                  torch::NoGradGuard ng;
                  opt.step();
                }));
  profile_fc1_overlap(g, n);
}

using Batches = std::vector<std::pair<at::Tensor, at::Tensor>>;

// One training step's times (seconds), from the clock and from DDP's StepStats.
struct StepTimes {
  double step, fwd, bwd, opt, exposed, hook_bwd, finalize;
};

// `warmup` steps, then `steps` timed ones; returns the timed ones' times and whether the
// last loss is finite.
template <class DDP>
std::vector<StepTimes> train_steps(ProcessGroup& g, DDP& ddp, torch::optim::SGD& opt,
                                   const Batches& batches, const DdpArgs& a, bool& finite) {
  std::vector<StepTimes> times;
  at::Tensor loss;
  auto step = [&](int k, bool record) {
    auto& [xb, yb] = batches[k % batches.size()];
    const double t0 = now_s();
    opt.zero_grad();
    {
      lockstep::numerics::Autocast ac({.enabled = a.bf16});
      loss = torch::nn::functional::cross_entropy(ddp(xb), yb);
    }
    const double t1 = now_s();
    loss.backward();
    const double t2 = now_s();
    opt.step();
    const double t3 = now_s();
    const auto& s = ddp.last_step_stats();
    if (record)
      times.push_back(
          {t3 - t0, t1 - t0, t2 - t1, t3 - t2, s.exposed_comm_s, s.backward_s, s.finalize_s});
  };
  for (int k = 0; k < a.warmup; ++k) step(k, false);
  g.barrier()->wait();
  for (int k = 0; k < a.steps; ++k) step(k, true);
  finite = std::isfinite(loss.item<double>());
  return times;
}

// Backward without communication, under the same contention: seconds of each.
template <class DDP>
std::vector<double> backward_nosync(ProcessGroup& g, DDP& ddp, torch::optim::SGD& opt,
                                    const Batches& batches, int steps, bool bf16) {
  g.barrier()->wait();
  std::vector<double> nosync;
  {
    auto guard = ddp.no_sync();
    for (int k = 0; k < std::max(5, steps / 3); ++k) {
      auto& [xb, yb] = batches[k % batches.size()];
      opt.zero_grad();
      at::Tensor l;
      {
        lockstep::numerics::Autocast ac({.enabled = bf16});
        l = torch::nn::functional::cross_entropy(ddp(xb), yb);
      }
      const double t0 = now_s();
      l.backward();
      nosync.push_back(now_s() - t0);
    }
  }
  g.barrier()->wait();
  return nosync;
}

void report_steps(int me, const std::vector<StepTimes>& times) {
  report_result(me, "step", median_of(times, &StepTimes::step));
  report_result(me, "forward", median_of(times, &StepTimes::fwd));
  report_result(me, "backward", median_of(times, &StepTimes::bwd));
  report_result(me, "optimizer", median_of(times, &StepTimes::opt));
  report_result(me, "exposed_comm", median_of(times, &StepTimes::exposed));
  report_result(me, "hook_backward", median_of(times, &StepTimes::hook_bwd));
  report_result(me, "finalize", median_of(times, &StepTimes::finalize));
}

}  // namespace

int ddp_worker(const DdpArgs& a) {
  at::set_num_threads(1);
  lockstep::InitOptions io;
  io.backend = a.backend;
  auto g = lockstep::init(io);
  const int me = g->rank();
  torch::manual_seed(0);
  lockstep::models::Mlp model(std::vector<int64_t>{1024, 4096, 4096, 10});
  lockstep::DDPOptions o;
  o.gradient_as_bucket_view = a.view;
  o.shared_buckets = !a.private_buckets;
  lockstep::DistributedDataParallel ddp(model, g, o);
  torch::optim::SGD opt(ddp.parameters(), 0.01);

  torch::manual_seed(1000 + me);
  Batches batches;
  for (int i = 0; i < 4; ++i)
    batches.emplace_back(torch::randn({a.batch, 1024}), torch::randint(0, 10, {a.batch}));

  bool ok = false;
  const std::vector<StepTimes> times = train_steps(*g, ddp, opt, batches, a, ok);
  // Identical replicas after training: a checksum of all parameters agrees everywhere.
  double sum = 0;
  for (const auto& p : ddp.parameters()) sum += p.to(at::kDouble).sum().item<double>();
  ok = same_everywhere(*g, sum) && ok;
  const std::vector<double> nosync = backward_nosync(*g, ddp, opt, batches, a.steps, a.bf16);

  report_steps(me, times);
  report_result(me, "backward_nosync", median(nosync));
  report_result(me, "buckets", double(ddp.last_step_stats().buckets));
  const auto hc = lockstep::comm::host_cache_stats();  // zeros when LOCKSTEP_HOST_CACHE=0
  report_result(me, "host_cache_maps", double(hc.maps));
  report_result(me, "host_cache_hits", double(hc.hits));
  report_result(me, "verified", ok ? 1.0 : 0.0);
  if (a.profile) profile(*g, ddp, opt);
  g->barrier()->wait();
  return ok ? 0 : 1;
}

}  // namespace lockstep::bench
