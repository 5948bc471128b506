// tests/unit/tensor_diff.h: the largest elementwise difference of two lists of tensors,
// the figure the numerics tests print beside their tolerance.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace lockstep::testing {

// Largest |a - b| over two lists, computed in float64 (0: bit-identical values); infinity
// when the lists' lengths, or a pair's shapes, dtypes or definedness, differ.
inline double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return INFINITY;
    if (!a[i].defined()) continue;
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type()) return INFINITY;
    const auto x = a[i].detach().to(torch::kDouble), y = b[i].detach().to(torch::kDouble);
    d = std::max(d, (x - y).abs().max().item<double>());
  }
  return d;
}

}  // namespace lockstep::testing
