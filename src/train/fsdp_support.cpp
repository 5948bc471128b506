#include "train/fsdp_support.h"

#include <optional>
#include <string>

namespace lockstep::train {
namespace {

// "" keeps the parameters' own dtype (the schema allows only these three words).
std::optional<at::ScalarType> dtype_of(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  return std::nullopt;
}

}  // namespace

fsdp::FSDPOptions fsdp_options(const StrategyConfig& s) {
  fsdp::FSDPOptions o;
  o.strategy = fsdp::parse_strategy(s.sharding);
  o.wrap_policy = s.wrap == "size" ? fsdp::wrap_by_size(s.wrap_min_params) : fsdp::wrap_all();
  o.mixed_precision.param_dtype = dtype_of(s.param_dtype);
  o.mixed_precision.reduce_dtype = dtype_of(s.reduce_dtype);
  o.backward_prefetch = s.backward_prefetch;
  o.forward_prefetch = s.forward_prefetch;
  return o;
}

}  // namespace lockstep::train
