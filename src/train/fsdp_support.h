// What the trainer adds around lockstep::FullyShardedDataParallel (strategy.kind = "fsdp",
// docs/trainer.md "FSDP"): the options from [strategy], and the scope in which evaluation
// and export read the workload's model directly.
#pragma once

#include <lockstep/parallel/fsdp/core.h>
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/train/config.h>

namespace lockstep::train {

// [strategy]'s sharding, wrap, wrap_min_params, param_dtype, reduce_dtype and prefetch keys
// as FSDPOptions (the values were checked by the schema).
fsdp::FSDPOptions fsdp_options(const StrategyConfig& s);

// Evaluation and export run the workload's own model, not FSDP's forward: a sharded unit's
// parameters hold no memory outside forward/backward. For the scope's lifetime every
// unit's full parameters are gathered in the master dtype (summon_full_params: collective,
// every rank constructs it and then holds the whole model), and the fsdp::wrap() units run
// as plain layers. The destructor releases them.
class FullParamsScope {
 public:
  explicit FullParamsScope(fsdp::FSDPCore& core);
  ~FullParamsScope();
  FullParamsScope(const FullParamsScope&) = delete;
  FullParamsScope& operator=(const FullParamsScope&) = delete;

 private:
  fsdp::FSDPCore& core_;
};

}  // namespace lockstep::train
