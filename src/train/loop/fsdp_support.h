// What the trainer adds around lockstep::FullyShardedDataParallel (strategy.kind = "fsdp",
// docs/trainer.md "FSDP"): the options from [strategy].
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/parallel/fsdp/options.h>
#include <lockstep/train/config.h>

namespace lockstep::train {

// [strategy]'s sharding, wrap, wrap_min_params, param_dtype, reduce_dtype, prefetch and
// compression keys as FSDPOptions (the values were checked by the schema); `seed` (run.seed)
// keys the compressed reduce-scatter's rounding.
fsdp::FSDPOptions fsdp_options(const StrategyConfig& s, uint64_t seed);

// The group FSDP shards over: `world` itself, or under sharding = "hybrid_shard" this
// rank's node (the LOCAL_WORLD_SIZE ranks lockstep-run numbers node * L + local), with
// `o.replicate_group` set to the ranks of this local rank on every node. With
// secondary_shards, `o.secondary_group` is the node (hpZ). Collective then (init_split).
std::shared_ptr<comm::ProcessGroup> fsdp_group(const StrategyConfig& s,
                                               std::shared_ptr<comm::ProcessGroup> world,
                                               fsdp::FSDPOptions& o);

}  // namespace lockstep::train
