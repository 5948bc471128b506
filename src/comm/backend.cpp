#include <lockstep/comm/backend.h>

namespace lockstep::comm {

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
