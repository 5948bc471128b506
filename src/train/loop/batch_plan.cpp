#include "train/loop/batch_plan.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace lockstep::train {

BatchPlan plan_batches(const TrainConfig& cfg, int world,
                       const std::vector<int64_t>& examples_per_rank) {
  const auto& t = cfg.train;
  const int64_t ref_global = t.batch_size * t.grad_accum * t.reference_world_size;
  BatchPlan p;
  p.accum = t.grad_accum;
  if (t.keep_global_batch) {
    if (ref_global % (t.batch_size * world) != 0)
      throw ConfigError(
          cfg.source + ": train.keep_global_batch: global batch " + std::to_string(ref_global) +
          " is not divisible by batch_size x world size = " + std::to_string(t.batch_size * world));
    p.accum = ref_global / (t.batch_size * world);
    p.rule = "global batch kept: accumulation " + std::to_string(p.accum) + ", lr unchanged";
  } else {
    const double ratio = double(world) / double(t.reference_world_size);
    p.lr_scale = cfg.optim.lr_scaling == "linear" ? ratio
                 : cfg.optim.lr_scaling == "sqrt" ? std::sqrt(ratio)
                                                  : 1.0;
    p.rule = "lr scaling '" + cfg.optim.lr_scaling + "' vs reference world " +
             std::to_string(t.reference_world_size) + ": x" +
             std::to_string(p.lr_scale).substr(0, 6);
  }
  // The remainder of each rank's part is dropped, so every rank runs the same steps (DDP).
  const int64_t min_part = examples_per_rank.empty() ? 0
                                                     : *std::min_element(examples_per_rank.begin(),
                                                                         examples_per_rank.end());
  p.per_step = t.batch_size * p.accum;
  p.steps_per_epoch = min_part / p.per_step;
  if (p.steps_per_epoch < 1)
    throw ConfigError(cfg.source + ": each rank has only " + std::to_string(min_part) +
                      " examples, fewer than one step (batch_size x accumulation = " +
                      std::to_string(p.per_step) + ")");
  p.total_steps = t.max_steps > 0 ? t.max_steps : t.epochs * p.steps_per_epoch;
  return p;
}

std::vector<std::string> describe(const BatchPlan& p, const TrainConfig& cfg, int world) {
  const int64_t b = cfg.train.batch_size;
  return {"effective batch: " + std::to_string(b) + " per rank x " + std::to_string(world) +
              " ranks x " + std::to_string(p.accum) +
              " accumulation = " + std::to_string(b * world * p.accum) + " examples/step (" +
              p.rule + "; peak lr " + std::to_string(cfg.optim.lr * p.lr_scale) + ")",
          std::to_string(p.steps_per_epoch) + " steps/epoch, " + std::to_string(p.total_steps) +
              " steps"};
}

}  // namespace lockstep::train
