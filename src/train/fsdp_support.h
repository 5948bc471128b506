// What the trainer adds around lockstep::FullyShardedDataParallel (strategy.kind = "fsdp",
// docs/trainer.md "FSDP"): the options from [strategy], and the scope in which evaluation
// and export read the workload's model directly.
#pragma once

#include <lockstep/parallel/fsdp/core.h>
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/parallel/fsdp/wrap.h>
#include <lockstep/train/config.h>

#include <torch/nn/module.h>

#include <utility>
#include <vector>

namespace lockstep::train {

// [strategy]'s sharding, wrap, wrap_min_params, param_dtype, reduce_dtype and prefetch keys
// as FSDPOptions (the values were checked by the schema).
fsdp::FSDPOptions fsdp_options(const StrategyConfig& s);

// Evaluation and export run the workload's own model, not FSDP's forward: a sharded unit's
// parameters hold no memory outside forward/backward, and a unit called outside FSDP's
// forward is an error. For the scope's lifetime every unit's full parameters are gathered
// (collective: every rank constructs it; each then holds the whole model) and the
// fsdp::wrap() wrappers run as plain layers. The destructor restores both.
class FullParamsScope {
 public:
  FullParamsScope(fsdp::FSDPCore& core, torch::nn::Module& model);
  ~FullParamsScope();
  FullParamsScope(const FullParamsScope&) = delete;
  FullParamsScope& operator=(const FullParamsScope&) = delete;

 private:
  fsdp::FSDPCore& core_;
  std::vector<std::pair<fsdp::WrapBase*, fsdp::UnitHooks*>> detached_;
};

}  // namespace lockstep::train
