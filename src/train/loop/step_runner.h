// One optimizer step of the trainer: `accum` micro-batches of the workload's loss (under
// autocast when [precision] asks for it), DDP's no_sync() on all but the last (FSDP
// reduce-scatters every micro-step and accumulates into the shards), the non-finite check
// (the gradient scaler's with loss scaling, else the guard's: one small allreduce either
// way), global-norm clipping, the optimizer step, and the communication statistics DDP
// reports.
#pragma once

#include <lockstep/numerics/autocast.h>
#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/parallel/diloco/diloco.h>
#include <lockstep/parallel/fsdp/fully_sharded_data_parallel.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>

namespace lockstep::train {

// DDP and FSDP wrap a module that has a forward(). The trainer's forward pass is the
// workload's loss of a micro-batch, so they wrap this adapter: the workload's model as its
// only child "module" (the same parameters in the same order, named "module.*" as in
// PyTorch's DDP) and a forward that runs the closure it is given, after DDP's pre-forward
// work (FSDP: between its root pre- and post-forward work; the fsdp::wrap()ed layers inside
// the model are its units, the rest of the model is the root unit).
class LossCallImpl : public torch::nn::Module {
 public:
  explicit LossCallImpl(std::shared_ptr<torch::nn::Module> model);
  torch::Tensor forward(const std::function<torch::Tensor()>& loss) { return loss(); }
};

struct CommStats {
  double exposed_comm_s = 0;  // summed over synchronized steps
  int64_t bytes_sent = 0;
  int64_t sync_steps = 0;
  int64_t skipped_steps = 0;  // non-finite steps skipped (train.non_finite = "skip", scaler)
};

// A step whose loss or gradients were not finite with train.non_finite = "stop": thrown on
// every rank (the decision is shared), naming the step and the ranks.
class NonFiniteStep : public Error {
 public:
  using Error::Error;
};

class StepRunner {
 public:
  // Builds the optimizer (optim.name) over the model's parameters; for strategy.kind =
  // "fsdp" first shards the model (collective: FSDP's construction) and builds the
  // optimizer over the local shards. `group` is null for kind = "single".
  StepRunner(const TrainConfig& cfg, Workload& workload, std::shared_ptr<torch::nn::Module> model,
             std::shared_ptr<comm::ProcessGroup> group);

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // FSDP's core (kind = "fsdp"), else null: checkpoints and evaluation go through it.
  fsdp::FSDPCore* fsdp() { return fsdp_ ? &fsdp_->core() : nullptr; }
  // What the optimizer updates: the model's parameters, or under FSDP the local shards.
  std::vector<torch::Tensor> parameters() const {
    return fsdp_ ? fsdp_->parameters() : model_->parameters();
  }
  const std::shared_ptr<comm::ProcessGroup>& group() const { return group_; }
  // The outer loop (kind = "diloco"; built with the runner: it broadcasts rank 0's
  // parameters), else null: checkpoints hold its state.
  diloco::DiLoCo* diloco() { return diloco_.get(); }
  // Collective, after the last step of training: DiLoCo synchronises every replica (the
  // evaluation and the final checkpoint see the outer parameters); nothing otherwise.
  void end_of_training();
  // Wraps the model in DDP with the configured hook (strategy.kind = "ddp"); call after
  // loading a checkpoint: construction broadcasts rank 0's (identical) parameters.
  // `start_step`: the step the run resumes at (PowerSGD's start_iter counts from 0).
  void wrap_ddp(int64_t start_step = 0);

  // Optimizer step number `step_number` (1-based, for messages) at `lr` over `accum`
  // micro-batches from `batches`; returns the step's mean loss. A step whose loss or
  // gradients are not finite on any rank is skipped on every rank (train.non_finite =
  // "skip", or loss scaling) or throws NonFiniteStep on every rank ("stop"), before the
  // optimizer touches the parameters.
  double step(BatchStream& batches, double lr, int64_t accum, int64_t step_number);
  // The same step in parts, for a loop that averages the gradients itself (the
  // fault-tolerant one, ft_loop.h) between accumulate() and apply_step():
  //   begin_step(lr); loss = accumulate(...) [+ accumulate(...)]; <average>; apply_step(...)
  // begin_step sets lr and zeroes the gradients. accumulate runs `accum` micro-batches of
  // `batches`, each loss weighted by weight / accum, and returns their weighted sum.
  // apply_step decides on finiteness (as step(): over the group, or alone without one),
  // clips, steps the optimizer (or skips the step); false when it skipped.
  void begin_step(double lr);
  double accumulate(BatchStream& batches, int64_t accum, double weight);
  bool apply_step(double loss_sum, int64_t step_number);
  const CommStats& comm_stats() const { return stats_; }
  // Called by apply_step before anything changes the parameters or the optimizer's state
  // (the trainer: Checkpointer::before_update, which waits for a save's staging copy).
  void set_before_update(std::function<void()> fn) { before_update_ = std::move(fn); }
  // The loss scaler (precision.loss_scaling = "dynamic"), else null.
  numerics::GradScaler* scaler() { return scaler_.get(); }

 private:
  torch::Tensor forward_loss(const Batch& batch);
  void clip_gradients();
  void prepare_precision();
  bool finite_or_skip(double loss_sum, int64_t step_number);
  void diloco_step(bool last);

  const TrainConfig& cfg_;
  Workload& workload_;
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::unique_ptr<fsdp::FullyShardedDataParallel<LossCallImpl>> fsdp_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<ddp::DistributedDataParallel<LossCallImpl>> ddp_;
  std::unique_ptr<diloco::DiLoCo> diloco_;
  std::optional<numerics::AutocastOptions> autocast_;
  std::unique_ptr<numerics::GradScaler> scaler_;
  CommStats stats_;
  std::function<void()> before_update_;
};

}  // namespace lockstep::train
