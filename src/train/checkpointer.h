// The trainer's checkpoints: what goes into one (model, optimizer, every rank's RNG, the
// position in the data) and how a run resumes from the newest (docs/checkpoint-format.md).
// Files are written atomically by CheckpointStore.
#pragma once

#include "train/batch_plan.h"

#include <lockstep/train/checkpoint_store.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <torch/torch.h>

namespace lockstep::train {

class Checkpointer {
 public:
  Checkpointer(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
               std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer);

  // Loads the newest checkpoint into the model, optimizer and this rank's RNG; returns
  // the step to start at (0 when there is none). Throws ConfigError when it was written
  // by another world size or for another number of steps.
  int64_t resume();
  // Whether `step` gets a checkpoint: every checkpoint.every_steps, the last step, or
  // when the run stops there (train.stop_after_steps).
  bool due(int64_t step) const;
  // Collective.
  void save(int64_t step, double last_loss);

 private:
  const TrainConfig& cfg_;
  const RunContext& ctx_;
  const BatchPlan& plan_;
  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer& optimizer_;
  CheckpointStore store_;
};

}  // namespace lockstep::train
