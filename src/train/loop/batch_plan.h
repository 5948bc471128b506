// The batch geometry of a run: accumulation, lr scaling, steps per epoch (docs/trainer.md,
// "Effective batch"). A pure function of the config, the world size and the workload's
// part sizes, so every rank computes the same plan without a collective.
#pragma once

#include <lockstep/train/config.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::train {

struct BatchPlan {
  int64_t accum = 1;            // micro-steps per optimizer step
  double lr_scale = 1.0;        // peak lr = optim.lr x lr_scale
  int64_t steps_per_epoch = 0;  // min over ranks of examples / (batch_size x accum)
  int64_t total_steps = 0;
  int64_t per_step = 0;  // examples per rank per optimizer step: batch_size x accum
  std::string rule;      // how accum and lr were chosen, for the log
};

// Throws ConfigError (naming cfg.source) when the global batch cannot be kept on `world`
// ranks or a rank holds fewer examples than one step takes.
BatchPlan plan_batches(const TrainConfig& cfg, int world,
                       const std::vector<int64_t>& examples_per_rank);

// The two log lines: the effective batch, and steps per epoch / in all.
std::vector<std::string> describe(const BatchPlan& plan, const TrainConfig& cfg, int world);

}  // namespace lockstep::train
