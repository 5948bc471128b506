#include <lockstep/error.h>

#include <cstdio>

namespace lockstep {

std::string CommContext::describe() const {
  std::ostringstream os;
  if (rank >= 0) os << "rank " << rank << "/" << world_size;
  if (!backend.empty()) os << " [" << backend << "]";
  if (!op.empty()) os << " " << op;
  if (seq > 0) os << " #" << seq;
  if (numel >= 0) {
    os << " (" << numel << " elements";
    if (!dtype.empty()) os << " " << dtype;
    os << ")";
  }
  if (peer >= 0) os << " peer rank " << peer;
  if (timeout_s > 0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " after %.1f s of %.1f s timeout", elapsed_s, timeout_s);
    os << buf;
  }
  return os.str();
}

const char* CommError::kind_name(Kind k) {
  switch (k) {
    case Kind::Failed:
      return "failed";
    case Kind::Timeout:
      return "timed out";
    case Kind::PeerGone:
      return "peer gone";
    case Kind::Mismatch:
      return "mismatch";
    case Kind::Rendezvous:
      return "rendezvous failed";
    case Kind::Aborted:
      return "aborted";
  }
  return "?";
}

CommError::CommError(Kind kind, CommContext ctx, const std::string& what_happened)
    : Error(ctx.describe() + ": " + kind_name(kind) + ": " + what_happened),
      kind_(kind),
      ctx_(std::move(ctx)),
      detail_(what_happened) {}

}  // namespace lockstep
