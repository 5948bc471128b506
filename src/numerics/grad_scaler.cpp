#include <lockstep/error.h>
#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/numerics/non_finite.h>

#include <torch/torch.h>

#include <cmath>

namespace lockstep::numerics {

GradScaler::GradScaler(GradScalerOptions options, std::shared_ptr<comm::ProcessGroup> group)
    : options_(options), group_(std::move(group)), scale_(options.init_scale) {
  const auto& o = options_;
  auto bad = [](const char* what) {
    throw InvalidArgument(lockstep::detail::concat("GradScalerOptions: ", what));
  };
  if (!(o.init_scale > 0 && std::isfinite(o.init_scale))) bad("init_scale must be finite and > 0");
  if (!(o.growth_factor > 1)) bad("growth_factor must be > 1");
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) bad("backoff_factor must be in (0, 1)");
  if (o.growth_interval < 1) bad("growth_interval must be >= 1");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * scale_;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  LOCKSTEP_CHECK(stage_ == Stage::Ready,
                 "GradScaler::unscale: already called for this step; call update() after step()");
  const auto grads = gradients_of(optimizer);
  // The reciprocal in float32, as PyTorch computes it: unscaled gradients are then the
  // same numbers as PyTorch's for power-of-two scales and close otherwise.
  const double inv = static_cast<double>(1.0f / static_cast<float>(scale_));
  const bool found = unscale_and_check(grads, inv);
  found_ranks_ = ranks_with_flag(flags_of_ranks(group_.get(), found ? 1 : 0));
  stage_ = Stage::Unscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  LOCKSTEP_CHECK(stage_ != Stage::Stepped, "GradScaler::step: called twice; call update() first");
  if (stage_ == Stage::Ready) unscale(optimizer);
  stage_ = Stage::Stepped;
  if (!found_ranks_.empty()) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  LOCKSTEP_CHECK(stage_ == Stage::Stepped, "GradScaler::update: call step() first");
  stage_ = Stage::Ready;
  if (!found_ranks_.empty()) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < options_.growth_interval) return;
  growth_tracker_ = 0;
  // The scale is a float32 in PyTorch: growing past float32's range would make the next
  // scaled loss inf on every step, so an overflowing growth is dropped.
  const double grown = scale_ * options_.growth_factor;
  if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", c10::IValue(scale_));
  archive.write("growth_tracker", c10::IValue(growth_tracker_));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  c10::IValue scale, tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", tracker);
  restore(scale.toDouble(), tracker.toInt());
}

void GradScaler::restore(double scale, int64_t growth_tracker) {
  LOCKSTEP_CHECK(scale > 0 && std::isfinite(scale) && growth_tracker >= 0,
                 "GradScaler::restore: scale ", scale, ", growth tracker ", growth_tracker);
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  stage_ = Stage::Ready;
  found_ranks_.clear();
}

}  // namespace lockstep::numerics
