// What the trainer adds around lockstep::FullyShardedDataParallel (strategy.kind = "fsdp",
// docs/trainer.md "FSDP"): the options from [strategy].
#pragma once

#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/train/config.h>

namespace lockstep::train {

// [strategy]'s sharding, wrap, wrap_min_params, param_dtype, reduce_dtype and prefetch keys
// as FSDPOptions (the values were checked by the schema).
fsdp::FSDPOptions fsdp_options(const StrategyConfig& s);

}  // namespace lockstep::train
