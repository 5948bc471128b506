// lockstep/parallel/ddp/model_check.h: verifying that every rank holds the same model.
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/error.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace lockstep::ddp {

// The ranks hold different models (parameter count, a shape or a dtype differ).
// Raised identically on every rank.
class ModelMismatch : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// Collective (two small allreduces): every rank compares the parameter list of
// every rank against rank 0's - count, then each parameter's shape and dtype, in
// order - and throws ModelMismatch naming the first differing parameter (its name
// on both ranks, both shapes and dtypes) and the ranks involved. Names themselves
// are not compared (two replicas may legitimately name modules differently).
void verify_same_model(comm::ProcessGroup& group, const std::vector<std::string>& names,
                       const std::vector<at::Tensor>& params);

}  // namespace lockstep::ddp
