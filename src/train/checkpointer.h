// The trainer's checkpoints: what goes into one (model, optimizer, every rank's RNG, the
// position in the data) and how a run resumes from the newest (docs/checkpoint-format.md).
// Under FSDP the model and optimizer are sharded: every rank writes its own
// FSDPCore::sharded_file_name(rank) instead of rank 0's model.pt and optimizer.pt, and a
// run may resume on another world size (the loader reshards). Files are written
// atomically by CheckpointStore.
#pragma once

#include "train/batch_plan.h"

#include <lockstep/parallel/fsdp/core.h>

#include <lockstep/train/checkpoint_store.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <torch/torch.h>
#include <nlohmann/json_fwd.hpp>

namespace lockstep::train {

class Checkpointer {
 public:
  // `fsdp`: the model's FSDP core when strategy.kind = "fsdp" (sharded files), else null.
  Checkpointer(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
               std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
               fsdp::FSDPCore* fsdp);

  // Loads the newest checkpoint into the model, optimizer and this rank's RNG; returns
  // the step to start at (0 when there is none). Throws ConfigError when it was written
  // for another number of steps, by another strategy (sharded vs not), or, except under
  // FSDP, by another world size.
  int64_t resume();
  // Whether `step` gets a checkpoint: every checkpoint.every_steps, the last step, or
  // when the run stops there (train.stop_after_steps).
  bool due(int64_t step) const;
  // Collective.
  void save(int64_t step, double last_loss);

 private:
  void check_compatible(const std::string& dir, const nlohmann::json& meta) const;
  void load_state(const std::string& dir);
  void restore_rng(const std::string& dir, int64_t step, int saved_world) const;

  const TrainConfig& cfg_;
  const RunContext& ctx_;
  const BatchPlan& plan_;
  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer& optimizer_;
  fsdp::FSDPCore* fsdp_;
  CheckpointStore store_;
};

}  // namespace lockstep::train
