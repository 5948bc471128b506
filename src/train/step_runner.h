// One optimizer step of the trainer: `accum` micro-batches of the workload's loss, DDP's
// no_sync() on all but the last, global-norm clipping, the optimizer step, and the
// communication statistics DDP reports.
#pragma once

#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <torch/torch.h>

#include <functional>
#include <memory>

namespace lockstep::train {

// DDP wraps a module that has a forward(). The trainer's forward pass is the workload's
// loss of a micro-batch, so DDP wraps this adapter: the workload's model as its only child
// "module" (the same parameters in the same order, named "module.*" as in PyTorch's DDP)
// and a forward that runs the closure it is given, after DDP's pre-forward work.
class LossCallImpl : public torch::nn::Module {
 public:
  explicit LossCallImpl(std::shared_ptr<torch::nn::Module> model);
  torch::Tensor forward(const std::function<torch::Tensor()>& loss) { return loss(); }
};

struct CommStats {
  double exposed_comm_s = 0;  // summed over synchronized steps
  int64_t bytes_sent = 0;
  int64_t sync_steps = 0;
};

class StepRunner {
 public:
  // Builds the optimizer (optim.name) over the model's parameters.
  StepRunner(const TrainConfig& cfg, Workload& workload, std::shared_ptr<torch::nn::Module> model);

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // Wraps the model in DDP with the configured hook (strategy.kind = "ddp"); call after
  // loading a checkpoint: construction broadcasts rank 0's (identical) parameters.
  void wrap_ddp(std::shared_ptr<comm::ProcessGroup> group);

  // One optimizer step at `lr` over `accum` micro-batches of `batch_size` from `batches`;
  // returns the step's mean loss.
  double step(BatchStream& batches, double lr, int64_t accum);
  const CommStats& comm_stats() const { return stats_; }

 private:
  torch::Tensor forward_loss(const Batch& batch);

  const TrainConfig& cfg_;
  Workload& workload_;
  std::shared_ptr<torch::nn::Module> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<ddp::DistributedDataParallel<LossCallImpl>> ddp_;
  CommStats stats_;
};

}  // namespace lockstep::train
