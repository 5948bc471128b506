// lockstep/comm/types.h: reduction ops, per-op options, and the descriptor of one operation.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace lockstep::comm {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

enum class ReduceOp : int { Sum = 0, Avg = 1, Max = 2, Min = 3 };
const char* reduce_op_name(ReduceOp op);

// Every options struct: timeout 0 means "the group's default" (ProcessGroupOptions::timeout).
struct AllreduceOptions {
  ReduceOp op = ReduceOp::Sum;
  Millis timeout{0};
};
struct BroadcastOptions {
  int root = 0;
  Millis timeout{0};
};
struct AllgatherOptions {
  Millis timeout{0};
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::Sum;
  Millis timeout{0};
};
struct AlltoallOptions {
  Millis timeout{0};
};
struct SendOptions {
  int tag = 0;
  Millis timeout{0};
};
struct RecvOptions {
  int tag = 0;
  Millis timeout{0};
};
struct BarrierOptions {
  Millis timeout{0};
};

enum class OpKind : int {
  Allreduce = 1,
  Broadcast,
  Allgather,
  ReduceScatter,
  Alltoall,
  Send,
  Recv,
  Barrier,
  Composite,
  AllocShared
};
const char* op_kind_name(OpKind k);

// What one operation is, as every rank must agree on it (for collectives).
struct OpDesc {
  OpKind kind = OpKind::Barrier;
  uint64_t seq = 0;  // collectives: per-group counter, identical on every rank
  int64_t numel =
      0;  // elements of the per-rank input (allgather/alltoall/reduce_scatter: see ProcessGroup)
  at::ScalarType dtype = at::kFloat;
  ReduceOp op = ReduceOp::Sum;
  int root = -1;            // broadcast root; send/recv peer
  int tag = 0;              // send/recv
  int64_t fingerprint = 0;  // composite: a digest of the body's parameters
};

// Timing of one op as the backend sees it: the backend must give up by `deadline`.
struct OpContext {
  OpDesc desc;
  Clock::time_point start;
  Clock::time_point deadline;
  Millis timeout{0};
};

// The context of one step of a composite collective (ProcessGroup::run_composite): same
// sequence number and deadline, the step's own kind, size and dtype.
inline OpContext step_context(const OpContext& whole, OpKind kind, int64_t numel,
                              at::ScalarType dtype) {
  OpContext c = whole;
  c.desc.kind = kind;
  c.desc.numel = numel;
  c.desc.dtype = dtype;
  return c;
}

// dtypes every backend supports.
bool is_supported_dtype(at::ScalarType t);
std::string dtype_name(at::ScalarType t);  // "float32", "bfloat16", ...

}  // namespace lockstep::comm
