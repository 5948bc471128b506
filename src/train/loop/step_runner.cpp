#include "train/loop/step_runner.h"

#include "train/loop/diloco_support.h"
#include "train/loop/fsdp_support.h"
#include "train/loop/precision_support.h"

#include <lockstep/env_contract.h>
#include <lockstep/numerics/non_finite.h>
#include <lockstep/parallel/ddp/hooks/powersgd_hook.h>
#include <lockstep/parallel/ddp/hooks/qsgd_hook.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace lockstep::train {

LossCallImpl::LossCallImpl(std::shared_ptr<torch::nn::Module> model) {
  register_module("module", std::move(model));
}

StepRunner::StepRunner(const TrainConfig& cfg, Workload& workload,
                       std::shared_ptr<torch::nn::Module> model,
                       std::shared_ptr<comm::ProcessGroup> group)
    : cfg_(cfg), workload_(workload), model_(std::move(model)), group_(std::move(group)) {
  prepare_precision();  // the parameters' dtype first: FSDP flattens what it is given
  if (cfg_.strategy.kind == "fsdp") {
    LOCKSTEP_CHECK(group_, "strategy.kind = \"fsdp\" needs a process group");
    fsdp::FSDPOptions o = fsdp_options(cfg_.strategy, uint64_t(cfg_.run.seed));
    auto shard_group = fsdp_group(cfg_.strategy, group_, o);
    fsdp_ = std::make_unique<fsdp::FullyShardedDataParallel<LossCallImpl>>(
        std::make_shared<LossCallImpl>(model_), shard_group, std::move(o));
    optimizer_ = make_optimizer(cfg_.optim, fsdp_->parameters());  // the local shards: 1/P
  } else {
    optimizer_ = make_optimizer(cfg_.optim, model_->parameters());
  }
  if (cfg_.strategy.kind == "diloco") {
    LOCKSTEP_CHECK(group_, "strategy.kind = \"diloco\" needs a process group");
    const auto params = model_->parameters();
    if (int64_t(params.size()) < cfg_.strategy.diloco_fragments)
      throw ConfigError(lockstep::detail::concat(
          cfg_.source, ": strategy.diloco_fragments = ", cfg_.strategy.diloco_fragments,
          " but the model has ", params.size(), " parameter tensors (each fragment needs one)"));
    diloco_ = std::make_unique<diloco::DiLoCo>(
        group_, params, diloco_options(cfg_.strategy, uint64_t(cfg_.run.seed)));
  }
}

void StepRunner::diloco_step(bool last) {
  if (!diloco_) return;
  const auto before = diloco_->stats();
  if (last)
    diloco_->synchronize();
  else
    diloco_->step();
  stats_.bytes_sent += diloco_->stats().bytes_sent - before.bytes_sent;
  stats_.exposed_comm_s += diloco_->stats().wait_s - before.wait_s;
  if (!last) ++stats_.sync_steps;  // per step: bytes_per_step is the round's average
}

void StepRunner::end_of_training() { diloco_step(true); }

void StepRunner::prepare_precision() {
  if (cfg_.memory.activation_checkpointing && !workload_.supports_activation_checkpointing())
    throw ConfigError(cfg_.source + ": memory.activation_checkpointing = true, but workload '" +
                      cfg_.run.workload +
                      "' does not checkpoint its layers; set it to false (docs/memory.md)");
  const auto dtype = *dtype_named(cfg_.precision.param_dtype);
  if (dtype != at::kFloat) model_->to(dtype);
  autocast_ = autocast_options(cfg_.precision);
  scaler_ = make_scaler(cfg_.precision, group_);
}

void StepRunner::wrap_ddp(int64_t start_step) {
  if (cfg_.strategy.kind != "ddp") return;
  DDPOptions d;
  // A model without buffers needs no buffer broadcast: it would cost a collective per forward.
  d.broadcast_buffers = !model_->buffers().empty();
  ddp_ = std::make_unique<ddp::DistributedDataParallel<LossCallImpl>>(
      std::make_shared<LossCallImpl>(model_), group_, d);
  if (cfg_.strategy.comm_hook == "bf16") ddp_->register_comm_hook(ddp::hooks::bf16_compress_hook());
  if (cfg_.strategy.comm_hook == "qsgd") {
    compress::QsgdOptions q;
    q.bits = int(cfg_.strategy.qsgd_bits);
    q.bucket_size = cfg_.strategy.qsgd_bucket_size;
    q.seed = uint64_t(cfg_.run.seed);
    ddp_->register_comm_hook(ddp::hooks::qsgd(q));
  }
  if (cfg_.strategy.comm_hook == "powersgd") {
    ddp::hooks::PowerSgdOptions o;
    o.matrix_approximation_rank = cfg_.strategy.powersgd_rank;
    o.start_iter = cfg_.strategy.powersgd_start_iter;
    o.min_compression_rate = cfg_.strategy.powersgd_min_compression_rate;
    o.use_error_feedback = cfg_.strategy.powersgd_error_feedback;
    o.warm_start = cfg_.strategy.powersgd_warm_start;
    o.random_seed = uint32_t(uint64_t(cfg_.run.seed) & 0xffffffffu);
    auto state = std::make_shared<ddp::hooks::PowerSgdState>(o);
    // A resumed run counts on from its step (compression starts at start_iter, not later);
    // the error and Q are not in checkpoints: they start afresh (docs/trainer.md).
    state->set_iter(start_step);
    ddp_->register_comm_hook(ddp::hooks::powersgd_hook(state));
  }
}

torch::Tensor StepRunner::forward_loss(const Batch& batch) {
  const std::function<torch::Tensor()> loss = [&] {
    std::optional<numerics::Autocast> scope;
    if (autocast_) scope.emplace(*autocast_);
    return workload_.loss(batch);
  };
  if (ddp_) return ddp_->forward(loss);
  if (fsdp_) return fsdp_->forward(loss);
  return loss();
}

// The global L2 norm over all gradients: under DDP every rank holds all of them (identical);
// under FSDP each rank holds a shard, so the norm is a collective (every rank calls it).
void StepRunner::clip_gradients() {
  if (cfg_.optim.grad_clip <= 0) return;
  if (fsdp_)
    fsdp_->clip_grad_norm(cfg_.optim.grad_clip);
  else
    torch::nn::utils::clip_grad_norm_(model_->parameters(), cfg_.optim.grad_clip);
}

namespace {

// LOCKSTEP_FAULT_NONFINITE = "STEP:RANK" (tests): true on that rank at that step.
bool fault_due(int64_t step_number, int rank) {
  const char* v = std::getenv(env::kFaultNonFinite);
  long long step = -1;
  int at_rank = -1;
  return v != nullptr && std::sscanf(v, "%lld:%d", &step, &at_rank) == 2 && step == step_number &&
         at_rank == rank;
}

std::string join(const std::vector<int>& ranks) {
  std::string s;
  for (const int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

// True when the step may go on. The decision is the group's (one small allreduce), so every
// rank skips, throws or steps alike (under DiLoCo each replica's own: no collective). With loss
// scaling the scaler decides (an overflow is expected now and then: skip and back off); else the
// guard checks the loss and this rank's gradients (under FSDP its shards).
bool StepRunner::finite_or_skip(double loss_sum, int64_t step_number) {
  if (scaler_) {
    scaler_->unscale(*optimizer_);
    if (scaler_->skipped_ranks().empty()) return true;
    // Backing off below 1 means the gradients are not finite at any scale: no overflow.
    if (scaler_->get_scale() * scaler_->options().backoff_factor < 1.0)
      throw NonFiniteStep(lockstep::detail::concat(
          "step ", step_number, ": the gradients are not finite even with the loss scale at ",
          scaler_->get_scale(), " (ranks ", join(scaler_->skipped_ranks()),
          "): the loss diverged, not an fp16 overflow; lower optim.lr"));
    return false;
  }
  const int flag = (std::isfinite(loss_sum) ? 0 : 2) |
                   (numerics::has_non_finite(numerics::gradients_of(*optimizer_)) ? 1 : 0);
  // Under DiLoCo a replica's steps are its own: it decides alone, with no collective a step.
  std::vector<int> flags;
  if (diloco_) {
    flags.assign(size_t(group_->size()), 0);
    flags[size_t(group_->rank())] = flag;
  } else {
    flags = numerics::flags_of_ranks(group_.get(), flag);
  }
  const auto bad = numerics::ranks_with_flag(flags);
  if (bad.empty()) return true;
  if (cfg_.train.non_finite == "skip") return false;
  std::vector<int> loss_ranks;
  for (const int r : bad)
    if ((flags[size_t(r)] & 2) != 0) loss_ranks.push_back(r);
  throw NonFiniteStep(lockstep::detail::concat(
      "step ", step_number, ": ", loss_ranks.empty() ? "the gradients are" : "the loss is",
      " not finite on rank(s) ", join(loss_ranks.empty() ? bad : loss_ranks),
      "; the step was not taken and no checkpoint holds this state (the newest checkpoint is "
      "intact). Lower optim.lr or set optim.grad_clip, or set train.non_finite = \"skip\" to "
      "skip such steps"));
}

void StepRunner::begin_step(double lr) {
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(lr);
  optimizer_->zero_grad();
}

double StepRunner::accumulate(BatchStream& batches, int64_t accum, double weight) {
  double loss_sum = 0;
  for (int64_t m = 0; m < accum; ++m) {
    const auto batch = batches.next(cfg_.train.batch_size);
    auto run = [&] {
      auto loss = forward_loss(*batch) / double(accum);
      if (weight != 1.0) loss = loss * weight;
      (scaler_ ? scaler_->scale(loss) : loss).backward();
      loss_sum += loss.item<double>();
    };
    if (ddp_ && m + 1 < accum) {
      auto guard = ddp_->no_sync();  // gradients accumulate locally until the last micro-step
      run();
    } else {
      run();
    }
  }
  return loss_sum;
}

bool StepRunner::apply_step(double loss_sum, int64_t step_number) {
  if (before_update_) before_update_();
  const bool go = finite_or_skip(loss_sum, step_number);
  if (go) clip_gradients();  // on unscaled gradients
  if (scaler_) {
    scaler_->step(*optimizer_);  // skips what the scaler decided to skip
    scaler_->update();
  } else if (go) {
    optimizer_->step();
  }
  if (!go) ++stats_.skipped_steps;
  diloco_step(false);  // a skipped step counts too: the same count on every rank
  return go;
}

double StepRunner::step(BatchStream& batches, double lr, int64_t accum, int64_t step_number) {
  begin_step(lr);
  // The compressed reduce-scatter rounds by its call count: from the step, so a resumed run
  // rounds as the uninterrupted one did.
  if (fsdp_) fsdp_->core().set_reduce_calls(uint64_t(step_number - 1) * uint64_t(accum));
  const int64_t fsdp_bytes = fsdp_ ? fsdp_->core().traffic().bytes_sent : 0;
  double loss_sum = accumulate(batches, accum, 1.0);
  if (fsdp_) {
    stats_.bytes_sent += fsdp_->core().traffic().bytes_sent - fsdp_bytes;
    ++stats_.sync_steps;
  }
  if (ddp_) {
    const auto& s = ddp_->last_step_stats();
    stats_.exposed_comm_s += s.exposed_comm_s;
    stats_.bytes_sent += s.bytes_sent;
    ++stats_.sync_steps;
  }
  if (fault_due(step_number, group_ ? group_->rank() : 0)) {
    loss_sum = std::nan("");
    for (auto& g : numerics::gradients_of(*optimizer_))
      if (g.numel() > 0) {
        g.fill_(std::nan(""));
        break;
      }
  }
  apply_step(loss_sum, step_number);
  return loss_sum;
}

}  // namespace lockstep::train
