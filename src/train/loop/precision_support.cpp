#include "train/loop/precision_support.h"

#include <lockstep/numerics/anyprecision_adamw.h>

namespace lockstep::train {

std::optional<at::ScalarType> dtype_named(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float64") return at::kDouble;
  if (name == "float16") return at::kHalf;
  LOCKSTEP_CHECK(name.empty(), "unknown dtype name '", name, "'");
  return std::nullopt;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& o,
                                                        const std::vector<torch::Tensor>& params) {
  if (o.name == "sgd")
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  if (o.name == "anyprecision_adamw")
    return std::make_unique<numerics::AnyPrecisionAdamW>(
        params, numerics::AnyPrecisionAdamWOptions(o.lr)
                    .betas({o.beta1, o.beta2})
                    .weight_decay(o.weight_decay)
                    .use_kahan_summation(o.kahan_summation)
                    .momentum_dtype(*dtype_named(o.momentum_dtype))
                    .variance_dtype(*dtype_named(o.variance_dtype))
                    .compensation_buffer_dtype(*dtype_named(o.compensation_dtype)));
  return std::make_unique<torch::optim::AdamW>(
      params,
      torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(o.weight_decay));
}

std::optional<numerics::AutocastOptions> autocast_options(const PrecisionConfig& p) {
  if (p.autocast == "none") return std::nullopt;
  numerics::AutocastOptions a;
  a.dtype = *dtype_named(p.autocast);
  return a;
}

std::unique_ptr<numerics::GradScaler> make_scaler(const PrecisionConfig& p,
                                                  std::shared_ptr<comm::ProcessGroup> group) {
  if (p.loss_scaling != "dynamic") return nullptr;
  numerics::GradScalerOptions o;
  o.init_scale = p.init_scale;
  o.growth_interval = p.growth_interval;
  return std::make_unique<numerics::GradScaler>(o, std::move(group));
}

}  // namespace lockstep::train
