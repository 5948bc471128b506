// What the trainer adds for [precision], [memory] and optim.name (docs/precision.md,
// docs/memory.md): the dtypes by name, the optimizer, the autocast scope and the loss scaler
// from the configuration (whose values the schema already checked).
#pragma once

#include <lockstep/numerics/autocast.h>
#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/train/config.h>

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::train {

// "float32" | "bfloat16" | "float64" | "float16"; "" is nullopt (keep the dtype one has).
std::optional<at::ScalarType> dtype_named(const std::string& name);

// optim.name over `params`: SGD, AdamW or AnyPrecisionAdamW with [optim]'s options.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimConfig& o,
                                                        const std::vector<torch::Tensor>& params);

// precision.autocast as a scope's options; nullopt for "none".
std::optional<numerics::AutocastOptions> autocast_options(const PrecisionConfig& p);

// precision.loss_scaling = "dynamic": a scaler over `group` (null for one process); else null.
std::unique_ptr<numerics::GradScaler> make_scaler(const PrecisionConfig& p,
                                                  std::shared_ptr<comm::ProcessGroup> group);

}  // namespace lockstep::train
