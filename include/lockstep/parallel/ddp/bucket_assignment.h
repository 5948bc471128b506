// lockstep/parallel/ddp/bucket_assignment.h: which parameter goes into which gradient bucket.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace lockstep::ddp {

struct BucketSpec {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> params;  // indices into the parameter list, in layout order
  int64_t bytes = 0;
};

// Groups parameters into buckets. `order` lists parameter indices in the order
// their gradients are expected to become ready (initially reverse registration
// order; after the first iteration the observed order). Walking `order`, each
// parameter joins the open bucket of its dtype; a bucket closes once it holds at
// least its limit: `first_bucket_bytes` for the first bucket of each dtype,
// `bucket_cap_bytes` after. Buckets are returned sorted by the position in
// `order` of their first parameter, so bucket 0 is the one expected ready first.
// Deterministic: ranks with the same inputs get the same buckets.
// `numels` and `dtypes` are indexed by parameter index; `order` must be a
// permutation of 0..numels.size()-1 (throws InvalidArgument otherwise).
std::vector<BucketSpec> compute_bucket_assignment(const std::vector<int64_t>& numels,
                                                  const std::vector<at::ScalarType>& dtypes,
                                                  const std::vector<int64_t>& order,
                                                  int64_t first_bucket_bytes,
                                                  int64_t bucket_cap_bytes);

}  // namespace lockstep::ddp
