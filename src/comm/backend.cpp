#include <lockstep/comm/backend.h>

#include "comm/backend_factories.h"

#include <ATen/ATen.h>

namespace lockstep::comm {

at::Tensor kept_buffer(at::Tensor& bytes, int64_t n, at::ScalarType t) {
  const int64_t need = n * static_cast<int64_t>(c10::elementSize(t));
  if (!bytes.defined() || bytes.numel() < need) bytes = at::empty({need}, at::kByte);
  return bytes.narrow(0, 0, need).view(t);
}

void Backend::allreduce_coalesced(std::vector<at::Tensor>& ts, ReduceOp op, const OpContext& ctx) {
  if (size() == 1) return;  // every op of one rank's tensors is the identity
  const bool divide = op == ReduceOp::Avg && !averages();
  std::vector<at::Tensor> flat_views;
  flat_views.reserve(ts.size());
  int64_t total = 0;
  for (auto& t : ts) {
    flat_views.push_back(t.view({-1}));
    total += t.numel();
  }
  thread_local at::Tensor bytes;  // the comm thread's, kept for its next call
  at::Tensor flat = kept_buffer(bytes, total, ts.at(0).scalar_type());
  at::cat_out(flat, flat_views);
  allreduce(flat, divide ? ReduceOp::Sum : op, ctx);
  // The division rides along with the copy back (a 0-dim divisor: libtorch 1.13's
  // Scalar overloads of the out= ops go through a full-size temporary).
  const at::Tensor p = divide ? at::scalar_tensor(double(size()), flat.options()) : at::Tensor();
  int64_t off = 0;
  for (auto& v : flat_views) {
    const at::Tensor part = flat.narrow(0, off, v.numel());
    divide ? at::div_out(v, part, p) : v.copy_(part);
    off += v.numel();
  }
}

CommContext op_context(const Backend& b, const OpDesc& d, const OpContext* timing) {
  CommContext c;
  c.rank = b.rank();
  c.world_size = b.size();
  c.backend = b.name();
  c.op = op_kind_name(d.kind);
  c.seq = d.seq;
  if (d.kind != OpKind::Barrier) {
    c.numel = d.numel;
    c.dtype = dtype_name(d.dtype);
  }
  if (d.kind == OpKind::Send || d.kind == OpKind::Recv) c.peer = d.root;
  if (timing) {
    c.elapsed_s = std::chrono::duration<double>(Clock::now() - timing->start).count();
    c.timeout_s = std::chrono::duration<double>(timing->timeout).count();
  }
  return c;
}

}  // namespace lockstep::comm
