// train/loop/lr_schedule.h: linear warmup then cosine decay.
//
// Stateless in the step: lr(step) depends only on the step, so a checkpoint needs to store
// nothing but the step for the schedule to resume exactly.
#pragma once

#include <cstdint>

namespace lockstep::train {

class LrSchedule {
 public:
  LrSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps, double min_lr_ratio);
  // The lr for optimizer step `step` (0-based): warmup (step+1)/warmup * peak, then a
  // cosine from peak down to peak*min_lr_ratio at the last step.
  double lr(int64_t step) const;

 private:
  double peak_;
  int64_t warmup_;
  int64_t total_;
  double min_ratio_;
};

}  // namespace lockstep::train
