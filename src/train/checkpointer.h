// The trainer's checkpoints: what goes into one (model, optimizer, every rank's RNG, the
// position in the data) and how a run resumes from the newest (docs/checkpoint-format.md).
// Under FSDP the model and optimizer are sharded: every rank writes its own
// FSDPCore::sharded_file_name(rank) instead of rank 0's model.pt and optimizer.pt (the
// loader reshards them). A run may resume on another world size under either strategy.
// Files are written atomically and verified on load by CheckpointStore.
#pragma once

#include "train/batch_plan.h"

#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/parallel/fsdp/core.h>

#include <lockstep/train/checkpoint_store.h>
#include <lockstep/train/config.h>
#include <lockstep/train/workload.h>

#include <torch/torch.h>
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace lockstep::train {

// The restart count the launcher exported (LOCKSTEP_RESTART_COUNT, else torchrun's
// TORCHELASTIC_RESTART_COUNT; lockstep/env_contract.h): 0 on a first start or when unset.
// Throws ConfigError naming the variable when it is not a non-negative integer.
int64_t restart_count_from_env();

class Checkpointer {
 public:
  // `fsdp`: the model's FSDP core when strategy.kind = "fsdp" (sharded files), else null.
  Checkpointer(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
               std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
               fsdp::FSDPCore* fsdp);

  // Collective. Loads the newest intact checkpoint into the model, optimizer and this
  // rank's RNG; returns the step to start at (0 when there is none). A damaged checkpoint
  // (a CheckpointError on any rank: checksum, size, missing file, unparsable archive) is
  // skipped with a warning and the previous one tried; when none is intact it throws
  // CheckpointError. Throws ConfigError when it was written for another number of steps or
  // by another strategy (sharded vs not); another world size is fine (the same total steps,
  // e.g. with train.keep_global_batch, map the data position);
  // Error when an intact file does not fit this model (no fallback: older ones won't).
  int64_t resume();
  // Whether `step` gets a checkpoint: every checkpoint.every_steps, the last step, or
  // when the run stops there (train.stop_after_steps).
  bool due(int64_t step) const;
  // Collective.
  void save(int64_t step, double last_loss);
  // The loss scaler whose scale and growth tracker go into meta.json and come back on
  // resume (precision.loss_scaling = "dynamic"); null: none.
  void set_scaler(amp::GradScaler* scaler) { scaler_ = scaler; }

 private:
  std::vector<std::string> shared_candidates() const;
  int64_t load(const std::string& dir);
  void check_compatible(const std::string& dir, const nlohmann::json& meta) const;
  void load_state(const CheckpointReader& ck);
  void restore_rng(const CheckpointReader& ck, int64_t step, int saved_world) const;

  const TrainConfig& cfg_;
  const RunContext& ctx_;
  const BatchPlan& plan_;
  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer& optimizer_;
  fsdp::FSDPCore* fsdp_;
  amp::GradScaler* scaler_ = nullptr;
  CheckpointStore store_;
  std::string resumed_note_;  // load()'s line for the log, said once every rank succeeded
};

}  // namespace lockstep::train
