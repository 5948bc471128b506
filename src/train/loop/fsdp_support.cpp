#include "train/loop/fsdp_support.h"

#include "train/loop/precision_support.h"

#include <lockstep/comm/init.h>
#include <lockstep/comm/launch_env.h>
#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include <optional>
#include <string>

namespace lockstep::train {

fsdp::FSDPOptions fsdp_options(const StrategyConfig& s, uint64_t seed) {
  fsdp::FSDPOptions o;
  o.strategy = fsdp::parse_strategy(s.sharding);
  o.wrap_policy = s.wrap == "size" ? fsdp::wrap_by_size(s.wrap_min_params) : fsdp::wrap_all();
  o.mixed_precision.param_dtype = dtype_named(s.param_dtype);
  o.mixed_precision.reduce_dtype = dtype_named(s.reduce_dtype);
  o.backward_prefetch = s.backward_prefetch;
  o.forward_prefetch = s.forward_prefetch;
  o.compression.gather_bits = int(s.gather_bits);
  o.compression.reduce_bits = int(s.reduce_bits);
  o.compression.codec.bucket_size = s.qsgd_bucket_size;
  o.compression.codec.seed = seed;
  return o;
}

std::shared_ptr<comm::ProcessGroup> fsdp_group(const StrategyConfig& s,
                                               std::shared_ptr<comm::ProcessGroup> world,
                                               fsdp::FSDPOptions& o) {
  const bool hybrid = s.sharding == "hybrid_shard";
  if (!hybrid && !s.secondary_shards) return world;
  const int P = world->size(), r = world->rank();
  const int L = comm::LaunchEnv::from_environment().local_world_size;
  if (L <= 0 || P % L != 0)
    throw ConfigError(lockstep::detail::concat(
        "strategy.", hybrid ? "sharding = \"hybrid_shard\"" : "secondary_shards = true", ": ",
        env::kLocalWorldSize, " = ", L, " does not divide the job's ", P,
        " ranks; start every node with the same --nproc-per-node"));
  comm::InitOptions io;
  io.backend = s.backend;
  auto node = comm::init_split(r / L, io);
  if (!hybrid) {  // hpZ: the node's ranks hold the secondary shards
    o.secondary_group = std::move(node);
    return world;
  }
  o.replicate_group = comm::init_split(r % L, io);
  return node;
}

}  // namespace lockstep::train
