// Internal: argument checks done on the caller's thread, before an op is queued,
// so that a bad call fails where it was made with InvalidArgument.
#pragma once

#include <lockstep/comm/types.h>
#include <lockstep/error.h>

#include <string>

namespace lockstep::comm {

void validate_tensor(const at::Tensor& t, const char* op);
void validate_pair(const at::Tensor& out, const at::Tensor& in, const char* op);
void validate_reduce(const at::Tensor& t, ReduceOp r, const char* op);
void validate_rank(int r, int size, const char* what);
void validate_multiple(const at::Tensor& t, int64_t expected, const char* op, const char* name,
                       const char* formula);

}  // namespace lockstep::comm
