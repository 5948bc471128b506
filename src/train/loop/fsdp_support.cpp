#include "train/loop/fsdp_support.h"

#include "train/loop/precision_support.h"

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

}  // namespace lockstep::train
