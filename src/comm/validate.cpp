#include "comm/validate.h"

namespace lockstep::comm {

void validate_tensor(const at::Tensor& t, const char* op) {
  LOCKSTEP_CHECK(t.defined(), op, ": the tensor is undefined");
  if (!t.device().is_cpu() && !t.device().is_cuda())
    throw InvalidArgument(
        lockstep::detail::concat(op, ": tensor is on ", t.device().str(),
                                 "; this process group handles CPU and CUDA tensors"));
  if (!t.is_contiguous())
    throw InvalidArgument(
        lockstep::detail::concat(op,
                                 ": tensor must be contiguous (call .contiguous() "
                                 "and copy the result back)"));
  if (!is_supported_dtype(t.scalar_type()))
    throw InvalidArgument(lockstep::detail::concat(op, ": dtype ", dtype_name(t.scalar_type()),
                                                   " is not supported (float32, float64, bfloat16, "
                                                   "float16, int32, int64, uint8 are)"));
}

void validate_pair(const at::Tensor& out, const at::Tensor& in, const char* op) {
  validate_tensor(out, op);
  validate_tensor(in, op);
  if (out.device() != in.device())
    throw InvalidArgument(lockstep::detail::concat(op, ": input is on ", in.device().str(),
                                                   " but output is on ", out.device().str(),
                                                   "; pass both on one device"));
  if (out.scalar_type() != in.scalar_type())
    throw InvalidArgument(lockstep::detail::concat(op, ": input is ", dtype_name(in.scalar_type()),
                                                   " but output is ",
                                                   dtype_name(out.scalar_type())));
}

void validate_reduce(const at::Tensor& t, ReduceOp r, const char* op) {
  if (r == ReduceOp::Avg && !at::isFloatingType(t.scalar_type()))
    throw InvalidArgument(lockstep::detail::concat(op, ": avg needs a floating-point tensor, got ",
                                                   dtype_name(t.scalar_type()),
                                                   " (use sum and divide)"));
}

void validate_rank(int r, int size, const char* what) {
  if (r < 0 || r >= size)
    throw InvalidArgument(
        lockstep::detail::concat(what, " ", r, " is not a rank of this group (0..", size - 1, ")"));
}

void validate_multiple(const at::Tensor& t, int64_t expected, const char* op, const char* name,
                       const char* formula) {
  if (t.numel() != expected)
    throw InvalidArgument(lockstep::detail::concat(
        op, ": ", name, " has ", t.numel(), " elements, expected ", formula, " = ", expected));
}

}  // namespace lockstep::comm
