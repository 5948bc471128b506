#include "train/loop/fsdp_support.h"

#include "train/loop/precision_support.h"

#include <optional>
#include <string>

namespace lockstep::train {

fsdp::FSDPOptions fsdp_options(const StrategyConfig& s) {
  fsdp::FSDPOptions o;
  o.strategy = fsdp::parse_strategy(s.sharding);
  o.wrap_policy = s.wrap == "size" ? fsdp::wrap_by_size(s.wrap_min_params) : fsdp::wrap_all();
  o.mixed_precision.param_dtype = dtype_named(s.param_dtype);
  o.mixed_precision.reduce_dtype = dtype_named(s.reduce_dtype);
  o.backward_prefetch = s.backward_prefetch;
  o.forward_prefetch = s.forward_prefetch;
  return o;
}

}  // namespace lockstep::train
