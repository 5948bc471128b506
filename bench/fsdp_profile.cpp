// lockstep-bench fsdp --profile: the per-unit costs of FSDP in isolation, on every rank at once
// (medians of 7 runs, each after a barrier; rank 0 reports, in seconds):
//   prof_gather          all-gather of one block's flat parameters into a kept buffer
//   prof_gather_alloc    the same into a fresh buffer, as FSDP does (storage resized from 0)
//   prof_reduce_scatter  reduce-scatter (average) of one block's flat gradient
//   prof_flat_grad       zeros + adding each parameter's gradient into a flat buffer, as FSDP
//                        moves gradients into its flat gradient buffer
//   prof_block_fwd       one block's forward compute alone (no communication)
//   prof_block_bwd       one block's backward compute alone
//   prof_fwd_chain       `layers` x (gather, block forward) back to back, no barrier between:
//                        what FULL_SHARD's forward does without prefetch
#include "bench_util.h"
#include "fsdp_bench.h"
#include "fsdp_model.h"
#include "jobs.h"

#include <lockstep/comm/process_group.h>

#include <torch/torch.h>

namespace lockstep::bench {
namespace {

double timed(comm::ProcessGroup& g, const std::function<void()>& fn) {
  return median(time_runs(fn, &g, {.warmup = 1, .min_iters = 7, .max_iters = 7, .min_seconds = 0}));
}

void profile_collectives(comm::ProcessGroup& g, int64_t padded) {
  const int me = g.rank(), P = g.size();
  at::Tensor shard = at::randn({padded / P}), full = at::empty({padded});
  report_result(me, "prof_gather", timed(g, [&] { g.allgather(full, shard)->wait(); }));
  report_result(me, "prof_gather_alloc", timed(g, [&] {
                  at::Tensor fresh = at::empty({padded});
                  g.allgather(fresh, shard)->wait();
                }));
  at::Tensor grad = at::randn({padded}), out = at::empty({padded / P});
  report_result(me, "prof_reduce_scatter", timed(g, [&] {
                  g.reduce_scatter(out, grad, {comm::ReduceOp::Avg, comm::Millis(0)})->wait();
                }));
}

void profile_block(comm::ProcessGroup& g, const FsdpArgs& a, int64_t padded) {
  const int me = g.rank();
  const auto& s = a.shape;
  BlockImpl block(s.d_model, s.heads(), nullptr);
  const auto x = torch::randn({s.batch, s.seq, s.d_model}).requires_grad_(true);
  const auto params = block.parameters();
  report_result(me, "prof_flat_grad", timed(g, [&] {
                  at::Tensor flat = at::zeros({padded});
                  int64_t off = 0;
                  for (const auto& p : params) {
                    flat.narrow(0, off, p.numel()).view(p.sizes()).add_(p.detach());
                    off += p.numel();
                  }
                }));
  report_result(me, "prof_block_fwd", timed(g, [&] { block.forward(x); }));
  at::Tensor y;
  std::vector<double> ts;
  for (int i = 0; i < 7; ++i) {
    y = block.forward(x);
    g.barrier()->wait();
    const double t0 = now_s();
    y.sum().backward();
    ts.push_back(now_s() - t0);
  }
  report_result(me, "prof_block_bwd", median(ts));
}

// What FULL_SHARD's forward does without prefetch: gather, compute, gather, compute...
void profile_chain(comm::ProcessGroup& g, const FsdpArgs& a, int64_t padded) {
  const auto& s = a.shape;
  BlockImpl block(s.d_model, s.heads(), nullptr);
  const auto x = torch::randn({s.batch, s.seq, s.d_model});
  at::Tensor shard = at::randn({padded / g.size()});
  torch::NoGradGuard no_grad;
  report_result(g.rank(), "prof_fwd_chain", timed(g, [&] {
                  for (int64_t l = 0; l < s.layers; ++l) {
                    at::Tensor full = at::empty({padded});
                    g.allgather(full, shard)->wait();
                    block.forward(x);
                  }
                }));
}

}  // namespace

void fsdp_profile(comm::ProcessGroup& g, const FsdpArgs& a) {
  const int P = g.size();
  const int64_t padded = (a.shape.block_params() + P - 1) / P * P;
  profile_collectives(g, padded);
  profile_block(g, a, padded);
  profile_chain(g, a, padded);
}

}  // namespace lockstep::bench
