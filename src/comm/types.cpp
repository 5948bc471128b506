#include <lockstep/comm/types.h>

namespace lockstep::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Allreduce:
      return "allreduce";
    case OpKind::Broadcast:
      return "broadcast";
    case OpKind::Allgather:
      return "allgather";
    case OpKind::ReduceScatter:
      return "reduce_scatter";
    case OpKind::Alltoall:
      return "alltoall";
    case OpKind::Send:
      return "send";
    case OpKind::Recv:
      return "recv";
    case OpKind::Barrier:
      return "barrier";
    case OpKind::Composite:
      return "composite";
    case OpKind::AllocShared:
      return "alloc_shared";
  }
  return "?";
}

bool is_supported_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf:
    case at::kInt:
    case at::kLong:
    case at::kByte:
      return true;
    default:
      return false;
  }
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kByte:
      return "uint8";
    default:
      return c10::toString(t);
  }
}

}  // namespace lockstep::comm
