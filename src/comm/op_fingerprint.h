// Internal: the fingerprint of one collective (what every rank must agree on before it
// runs), its fixed-size and text forms, and how errors and stall reports describe it.
//
// A fingerprint is the OpDesc fields every rank must have equal: kind, sequence number,
// element count, dtype, reduce op, root and (composites) the body's options digest.
// Send/recv are not collectives and have none.
#pragma once

#include <lockstep/comm/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::comm {

// "allgather #12 (float32, 1024)", "allreduce #3 (float32, 1000, sum)",
// "broadcast #5 (int64, 8, root 1)", "barrier #12", "composite #7 (float32, 4096, options 42)".
std::string describe_op(const OpDesc& d);

// True if ranks that entered `a` and `b` run the same collective.
bool same_fingerprint(const OpDesc& a, const OpDesc& b);

// "rank 0 entered allgather #12 (float32, 1024) but rank 1 entered barrier #12; every rank
// must issue ..." (plus a hint when only the composite options differ).
std::string describe_mismatch(int rank, const OpDesc& mine, int other, const OpDesc& theirs);

// The fingerprint as 7 int64 words (allgather-based check) and as text (store-based check).
constexpr int kFingerprintWords = 7;
using PackedOp = std::array<int64_t, kFingerprintWords>;
PackedOp pack_op(const OpDesc& d);
OpDesc unpack_op(const int64_t* words);
std::string op_to_text(const OpDesc& d);                   // "kind seq numel dtype op root fp"
std::optional<OpDesc> op_from_text(const std::string& s);  // nullopt if malformed

}  // namespace lockstep::comm

namespace lockstep::comm {

class StoreChannel;

// The verdict of one fingerprint exchange through the store.
struct FingerprintVerdict {
  enum class Status { Agree, Mismatch, Missing, Stopped };
  Status status = Status::Agree;
  int rank = -1;             // Mismatch: the first rank whose fingerprint differs from rank 0's
  OpDesc leader, other;      // Mismatch: rank 0's fingerprint and that rank's
  std::vector<int> missing;  // Missing: the ranks that had not posted theirs when this rank
                             // gave up (empty: all had, but rank 0 published no verdict)
};

// LOCKSTEP_DEBUG=DETAIL's check of collective `mine` (seq >= 1) through the store: every
// rank posts its fingerprint as "fp/<seq>/<rank>"; rank 0 compares them all and publishes
// the verdict as "fp/<seq>/v", which the others read; so every rank reaches the same
// verdict, and a mismatch is known everywhere as soon as the last rank has posted. Keys of
// op seq - 1 are deleted then (each rank's own, and rank 0 the verdict): the store holds at
// most two ops' keys per group. Gives up at `deadline` (Missing) or when `stop()` (Stopped).
FingerprintVerdict exchange_fingerprints(StoreChannel& ch, int rank, int size, const OpDesc& mine,
                                         Clock::time_point deadline,
                                         const std::function<bool()>& stop);

}  // namespace lockstep::comm
