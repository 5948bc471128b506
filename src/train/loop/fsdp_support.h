// What the trainer adds around lockstep::FullyShardedDataParallel (strategy.kind = "fsdp",
// docs/trainer.md "FSDP"): the options from [strategy].
#pragma once

#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/train/config.h>

namespace lockstep::train {

// [strategy]'s sharding, wrap, wrap_min_params, param_dtype, reduce_dtype, prefetch and
// compression keys as FSDPOptions (the values were checked by the schema); `seed` (run.seed)
// keys the compressed reduce-scatter's rounding.
fsdp::FSDPOptions fsdp_options(const StrategyConfig& s, uint64_t seed);

}  // namespace lockstep::train
