#include "train/loop/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace lockstep::train {

LrSchedule::LrSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps,
                       double min_lr_ratio)
    : peak_(peak_lr),
      warmup_(warmup_steps),
      total_(std::max<int64_t>(total_steps, 1)),
      min_ratio_(min_lr_ratio) {}

double LrSchedule::lr(int64_t step) const {
  if (step < warmup_) return peak_ * double(step + 1) / double(warmup_);
  const int64_t span = std::max<int64_t>(total_ - warmup_ - 1, 1);
  const double progress = std::clamp(double(step - warmup_) / double(span), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak_ * (min_ratio_ + (1.0 - min_ratio_) * cosine);
}

}  // namespace lockstep::train
