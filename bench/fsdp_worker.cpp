// lockstep-bench fsdp --worker: one rank of a lockstep job (DDP or FSDP with a sharding
// strategy) training the benchmark's transformer with fp32 AdamW.
//
// Per step (no barrier between steps, as in training): zero_grad + forward + loss, backward,
// optimizer step, timed separately; `warmup` steps, then `steps` timed ones (medians).
// Memory, sampled during the warm-up steps (all steps under a cap) so that the probes do not
// perturb the timed steps:
//  - model state: the storage bytes of the parameters (FSDP: the gathered full parameters
//    and the shards), their gradients and the optimizer state, each storage once, at the
//    end of each block's forward, when each block's input gradient is ready, after backward
//    and after the optimizer step; the peak over those points. FSDP's flat gradient buffers
//    that are in flight during backward are internal to it and not seen here (the tensor
//    bytes below include them).
//  - tensor bytes: every CPU tensor storage (counting allocator), live at the start and
//    peak over the run; activations = the live bytes a forward adds beyond the model state.
//  - the process: VmRSS after init (before the model), VmHWM (peak RSS) at the end.
// Each memory figure is the maximum over ranks. Rank 0 prints "RESULT key value" lines.
#include "bench_util.h"
#include "fsdp_bench.h"
#include "fsdp_memory.h"
#include "fsdp_model.h"
#include "jobs.h"

#include <lockstep/comm/launch_env.h>
#include <lockstep/lockstep.h>
#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/parallel/fsdp/fsdp.h>

#include <torch/torch.h>

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lockstep::bench {
namespace {

using Batches = std::vector<std::pair<at::Tensor, at::Tensor>>;
using TensorsFn = std::function<std::vector<at::Tensor>()>;

struct StepTimes {
  double step, fwd, bwd, opt;
};

// What a run measured on this rank.
struct Measured {
  std::vector<StepTimes> times;
  double loss_first = NAN, loss_last = NAN;
  int64_t state_peak = 0, state_end = 0, activations = 0;
  int64_t full_at_peak = 0;  // of state_peak: the module's own parameters and their gradients
  int64_t build_peak = 0;    // peak tensor bytes before training (model, wrapper, optimizer)
  int64_t vmdata_built = 0;  // VmData then
};

// The model state at one moment: all of it, and the part the module's own parameters and
// their gradients hold (DDP: the replica; FSDP: the gathered units and the gradients not
// yet moved into its flat buffers).
struct StateSample {
  int64_t total = 0, full = 0;
};

void add_optimizer_state(StorageBytes& sb, const torch::optim::Optimizer& opt) {
  for (const auto& kv : opt.state())
    if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(kv.second.get())) {
      sb.add(s->exp_avg());
      sb.add(s->exp_avg_sq());
      sb.add(s->max_exp_avg_sq());
    }
}

// Parameters, gradients and optimizer state now, each storage once. `tensors` returns the
// module's parameters first (`module_params` of them), then the rest (shards, buckets).
StateSample model_state(const TensorsFn& tensors, size_t module_params,
                        const torch::optim::Optimizer& opt) {
  StorageBytes sb;
  StateSample s;
  const auto ts = tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i == module_params) s.full = sb.bytes();
    sb.add(ts[i]);
    sb.add(ts[i].grad());
  }
  if (ts.size() <= module_params) s.full = sb.bytes();
  add_optimizer_state(sb, opt);
  s.total = sb.bytes();
  return s;
}

// Trains `a.warmup + a.steps` steps of `par` (DDP or FSDP); `probe` is the model's probe.
template <class Par>
Measured train(Par& par, torch::optim::AdamW& opt, ProcessGroup& g, const FsdpArgs& a,
               const Batches& batches, Probe& probe, const TensorsFn& state_tensors) {
  Measured m;
  m.build_peak = peak_tensor_bytes();
  m.vmdata_built = read_proc_memory().data;
  const size_t module_params = par.module()->parameters().size();
  auto state = [&] { return model_state(state_tensors, module_params, opt).total; };
  auto sample = [&] {
    const StateSample s = model_state(state_tensors, module_params, opt);
    if (s.total > m.state_peak) m.state_peak = s.total, m.full_at_peak = s.full;
  };
  reset_peak_tensor_bytes();
  for (int k = 0; k < a.warmup + a.steps; ++k) {
    const bool measure = k < a.warmup || a.cap_bytes > 0;
    probe = measure ? Probe(sample) : Probe();
    const auto& [x, y] = batches[static_cast<size_t>(k) % batches.size()];
    const double t0 = now_s();
    opt.zero_grad();
    const int64_t live0 = measure ? live_tensor_bytes() : 0, state0 = measure ? state() : 0;
    const at::Tensor loss = torch::nn::functional::cross_entropy(par(x), y);
    if (measure)
      m.activations = std::max(m.activations, live_tensor_bytes() - live0 - (state() - state0));
    const double t1 = now_s();
    loss.backward();
    if (measure) sample();
    const double t2 = now_s();
    opt.step();
    const double t3 = now_s();
    if (measure) sample();
    const double l = loss.item<double>();
    if (k == 0) m.loss_first = l;
    m.loss_last = l;
    if (k >= a.warmup) m.times.push_back({t3 - t0, t1 - t0, t2 - t1, t3 - t2});
    if (k + 1 == a.warmup) g.barrier()->wait();
  }
  probe = Probe();
  m.state_end = state();
  return m;
}

// The sum of all parameters of the model: `replicated` tensors are the same on every rank
// (checked), sharded ones are summed over ranks.
double param_sum(ProcessGroup& g, const std::vector<at::Tensor>& ts, bool sharded, bool& same) {
  double s = 0;
  for (const auto& t : ts) s += t.detach().to(at::kDouble).sum().item<double>();
  if (sharded) return reduced_over_ranks(g, s, comm::ReduceOp::Sum);
  same = reduced_over_ranks(g, s) == reduced_over_ranks(g, s, comm::ReduceOp::Min);
  return s;
}

void report_times(int me, const std::vector<StepTimes>& times) {
  report_result(me, "step", median_of(times, &StepTimes::step));
  report_result(me, "forward", median_of(times, &StepTimes::fwd));
  report_result(me, "backward", median_of(times, &StepTimes::bwd));
  report_result(me, "optimizer", median_of(times, &StepTimes::opt));
}

// Memory figures, each the maximum over ranks.
void report_memory(ProcessGroup& g, const Measured& m, const ProcMemory& base, int64_t tensor_start,
                   int64_t shared_bytes) {
  const ProcMemory end = read_proc_memory();
  const struct mallinfo2 heap = mallinfo2();  // what malloc holds: in use, and free inside
  const std::map<std::string, double> mem{{"rss_base", double(base.rss)},
                                          {"heap_used", double(heap.uordblks)},
                                          {"heap_free", double(heap.fordblks)},
                                          {"heap_mmapped", double(heap.hblkhd)},
                                          {"rss_peak", double(end.hwm)},
                                          {"vmdata_base", double(base.data)},
                                          {"vmdata_end", double(end.data)},
                                          {"vmdata_built", double(m.vmdata_built)},
                                          {"tensor_peak_build", double(m.build_peak)},
                                          {"state_peak", double(m.state_peak)},
                                          {"state_end", double(m.state_end)},
                                          {"tensor_start", double(tensor_start)},
                                          {"tensor_peak", double(peak_tensor_bytes())},
                                          {"activations", double(m.activations)},
                                          {"shared_bytes", double(shared_bytes)},
                                          {"state_peak_full", double(m.full_at_peak)}};
  for (const auto& [k, v] : mem) report_result(g.rank(), k, reduced_over_ranks(g, v));
}

torch::optim::AdamW make_adamw(std::vector<at::Tensor> params) {
  return torch::optim::AdamW(std::move(params),
                             torch::optim::AdamWOptions(1e-5).weight_decay(0.01));
}

// What every strategy's run ends with: times, losses, the checksum, memory, completion.
struct RunEnd {
  const FsdpArgs& a;
  ProcessGroup& g;
  const ProcMemory& base;
  int64_t tensor_start;
};

int finish(const RunEnd& e, const Measured& m, double sum, bool same, int64_t shared_bytes) {
  const int me = e.g.rank();
  const bool ok = same && std::isfinite(m.loss_last);
  report_times(me, m.times);
  report_result(me, "loss_first", m.loss_first);
  report_result(me, "loss_last", m.loss_last);
  report_result(me, "param_sum", sum);
  report_result(me, "verified", ok ? 1.0 : 0.0);
  report_memory(e.g, m, e.base, e.tensor_start, shared_bytes);
  if (e.a.profile) fsdp_profile(e.g, e.a);
  e.g.barrier()->wait();
  report_result(me, "completed", 1.0);
  return ok ? 0 : 1;
}

int run_ddp(const FsdpArgs& a, const std::shared_ptr<ProcessGroup>& g,
            std::shared_ptr<TransformerLM> model, Probe& probe, const Batches& batches,
            const ProcMemory& base) {
  lockstep::DDPOptions o;
  o.shared_buckets = !a.private_buckets;
  o.gradient_as_bucket_view = a.private_buckets;  // the grads are the buckets either way
  lockstep::DistributedDataParallel ddp(model, g, o);
  auto opt = make_adamw(ddp.parameters());
  auto tensors = [&] {
    std::vector<at::Tensor> ts = model->parameters();
    for (const auto& b : ddp.reducer().buckets()) ts.push_back(b.buffer);
    return ts;
  };
  const int64_t tensor_start = live_tensor_bytes();
  const Measured m = train(ddp, opt, *g, a, batches, probe, tensors);
  int64_t shared = 0;
  if (o.shared_buckets && g->size() > 1)
    for (const auto& b : ddp.reducer().buckets()) shared += b.buffer.nbytes();
  bool same = true;
  const double sum = param_sum(*g, model->parameters(), false, same);
  return finish({a, *g, base, tensor_start}, m, sum, same, shared);
}

int run_fsdp(const FsdpArgs& a, const std::shared_ptr<ProcessGroup>& g,
             std::shared_ptr<TransformerLM> model, Probe& probe, const Batches& batches,
             const ProcMemory& base) {
  fsdp::FSDPOptions o;
  o.strategy = fsdp::parse_strategy(a.strategy);
  o.compression.gather_bits = a.gather_bits;
  o.compression.reduce_bits = a.reduce_bits;
  if (a.hpz) {  // the ranks of this node: lockstep-run numbers them node * L + local
    const int L = comm::LaunchEnv::from_environment().local_world_size;
    o.secondary_group = lockstep::init_split(g->rank() / L);
  }
  lockstep::FullyShardedDataParallel f(model, g, o);
  auto opt = make_adamw(f.parameters());
  auto tensors = [&] {
    std::vector<at::Tensor> ts = model->parameters();
    for (const auto& s : f.parameters()) ts.push_back(s);
    return ts;
  };
  const int64_t tensor_start = live_tensor_bytes();
  const Measured m = train(f, opt, *g, a, batches, probe, tensors);
  bool same = true;
  const bool sharded = o.strategy != fsdp::ShardingStrategy::NoShard;
  const double sum = param_sum(*g, f.parameters(), sharded, same);
  const auto t = f.core().traffic();
  report_result(g->rank(), "traffic_ratio",
                t.bytes_sent > 0 ? double(t.bytes_uncompressed) / double(t.bytes_sent) : 1.0);
  return finish({a, *g, base, tensor_start}, m, sum, same, 0);
}

}  // namespace

int fsdp_worker(const FsdpArgs& a) {
  if (a.cap_bytes > 0) set_data_limit(a.cap_bytes);
  at::set_num_threads(1);
  auto g = lockstep::init();  // installs lockstep's host cache, which the counting wraps
  install_counting_allocator();
  const ProcMemory base = read_proc_memory();
  auto probe = std::make_shared<Probe>();
  auto model = std::make_shared<TransformerLM>(a.shape, probe);
  init_deterministic(*model);
  Batches batches;
  for (int k = 0; k < 4; ++k) batches.push_back(make_batch(a.shape, g->rank(), k));
  if (a.strategy == "ddp") return run_ddp(a, g, model, *probe, batches, base);
  return run_fsdp(a, g, model, *probe, batches, base);
}

}  // namespace lockstep::bench
