#include <lockstep/comm/backend.h>

#include <ATen/ATen.h>

namespace lockstep::comm {

namespace {

// `n` elements of dtype `t` in a buffer the calling (comm) thread keeps across calls. A
// fresh one per call would come from the thread's malloc arena, which glibc serves by a
// new mmap() above 64 MiB whatever MALLOC_MMAP_MAX_ says: page-faulting through the
// whole buffer every step (50 ms for a 67 MB DDP bucket, against 6 ms for the copy).
at::Tensor reused_flat(int64_t n, at::ScalarType t) {
  thread_local at::Tensor bytes;
  const int64_t need = n * static_cast<int64_t>(c10::elementSize(t));
  if (!bytes.defined() || bytes.numel() < need) bytes = at::empty({need}, at::kByte);
  return bytes.narrow(0, 0, need).view(t);
}

}  // namespace

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
  at::Tensor flat = reused_flat(total, ts.at(0).scalar_type());
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
