// tally.h's check of a tensor against its expected value, exactly: the element counts must
// match, then the max difference (in float64) is reported against a tolerance of 0.
#pragma once
#include "tally.h"

#include <ATen/ATen.h>

#include <string>

namespace tally {

inline void exact(const std::string& what, const at::Tensor& got, const at::Tensor& want) {
  if (got.numel() != want.numel())
    return check(what, false,
                 format("numel %lld vs %lld", static_cast<long long>(got.numel()),
                        static_cast<long long>(want.numel())));
  const double diff = got.numel() == 0
                          ? 0.0
                          : (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
  report(what, diff, 0);
}

}  // namespace tally
