// lockstep/numerics/non_finite.h: finding inf/NaN in gradients, on one rank and across
// ranks. The gradient scaler and the trainer's non-finite guard both use it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace lockstep::comm {
class ProcessGroup;
}

namespace lockstep::numerics {

// The defined gradients of `optimizer`'s parameters, group by group (under FSDP: the shards').
std::vector<at::Tensor> gradients_of(const torch::optim::Optimizer& optimizer);

// Multiplies every tensor by `inv_scale` in place and returns whether any element was
// inf or NaN before the multiplication (one pass over the data; floating dtypes; the
// product is computed in float32 for float16/bfloat16 and in the tensor's dtype for
// float32/float64). Undefined tensors are skipped. CPU in every libtorch, CUDA through
// libtorch's own `_amp_foreach_non_finite_check_and_unscale_`. inv_scale = 1 only checks
// (nothing is written).
bool unscale_and_check(const std::vector<at::Tensor>& tensors, double inv_scale);

// True when any element of any tensor is inf or NaN (read only).
bool has_non_finite(const std::vector<at::Tensor>& tensors);

// Combines a small non-negative integer per rank (e.g. a bit set of what went wrong) with
// one small allreduce over `group` (every rank calls it, in the same place of its collective
// sequence) and returns every rank's value, index = rank: the same vector on every rank. A
// null group is one process.
std::vector<int> flags_of_ranks(comm::ProcessGroup* group, int flag);

// The ranks whose flag is non-zero, in increasing order.
std::vector<int> ranks_with_flag(const std::vector<int>& flags);

}  // namespace lockstep::numerics
