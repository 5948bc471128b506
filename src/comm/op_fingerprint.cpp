#include "comm/op_fingerprint.h"

#include "comm/store_channel.h"

#include <sstream>

namespace lockstep::comm {

std::string describe_op(const OpDesc& d) {
  std::ostringstream os;
  os << op_kind_name(d.kind) << " #" << d.seq;
  if (d.kind == OpKind::Barrier) return os.str();
  os << " (" << dtype_name(d.dtype) << ", " << d.numel;
  if (d.kind == OpKind::Allreduce || d.kind == OpKind::ReduceScatter)
    os << ", " << reduce_op_name(d.op);
  if (d.kind == OpKind::Broadcast) os << ", root " << d.root;
  if (d.fingerprint != 0) os << ", options " << d.fingerprint;
  os << ")";
  return os.str();
}

bool same_fingerprint(const OpDesc& a, const OpDesc& b) { return pack_op(a) == pack_op(b); }

std::string describe_mismatch(int rank, const OpDesc& mine, int other, const OpDesc& theirs) {
  std::ostringstream os;
  os << "rank " << rank << " entered " << describe_op(mine) << " but rank " << other << " entered "
     << describe_op(theirs);
  OpDesc same_options = theirs;
  same_options.fingerprint = mine.fingerprint;
  if (theirs.fingerprint != mine.fingerprint && same_fingerprint(mine, same_options))
    os << "; the ranks use different options for it (e.g. different LOCKSTEP_COMPRESSION_* "
          "settings)";
  os << " (every rank must issue the same collectives, in the same order, with the same sizes, "
        "dtypes and roots)";
  return os.str();
}

PackedOp pack_op(const OpDesc& d) {
  return {static_cast<int64_t>(d.kind),
          static_cast<int64_t>(d.seq),
          d.numel,
          static_cast<int64_t>(d.dtype),
          static_cast<int64_t>(d.op),
          d.root,
          d.fingerprint};
}

OpDesc unpack_op(const int64_t* w) {
  OpDesc d;
  d.kind = static_cast<OpKind>(w[0]);
  d.seq = static_cast<uint64_t>(w[1]);
  d.numel = w[2];
  d.dtype = static_cast<at::ScalarType>(w[3]);
  d.op = static_cast<ReduceOp>(w[4]);
  d.root = static_cast<int>(w[5]);
  d.fingerprint = w[6];
  return d;
}

std::string op_to_text(const OpDesc& d) {
  std::ostringstream os;
  const PackedOp p = pack_op(d);
  for (int i = 0; i < kFingerprintWords; ++i) os << (i ? " " : "") << p[i];
  return os.str();
}

std::optional<OpDesc> op_from_text(const std::string& s) {
  std::istringstream is(s);
  PackedOp p{};
  for (auto& w : p)
    if (!(is >> w)) return std::nullopt;
  std::string rest;
  if (is >> rest) return std::nullopt;
  return unpack_op(p.data());
}

}  // namespace lockstep::comm

namespace lockstep::comm {
namespace {

std::string fp_key(uint64_t seq, const std::string& who) {
  return "fp/" + std::to_string(seq) + "/" + who;
}

// Rank 0's verdict: "ok", or "<rank>\n<rank 0's fingerprint>\n<its fingerprint>".
std::string encode_verdict(const FingerprintVerdict& v) {
  if (v.status != FingerprintVerdict::Status::Mismatch) return "ok";
  return std::to_string(v.rank) + "\n" + op_to_text(v.leader) + "\n" + op_to_text(v.other);
}

FingerprintVerdict decode_verdict(const std::string& s) {
  FingerprintVerdict v;
  if (s == "ok") return v;
  const auto a = s.find('\n'), b = s.find('\n', a + 1);
  const auto leader = op_from_text(s.substr(a + 1, b - a - 1));
  const auto other = op_from_text(s.substr(b + 1));
  if (a == std::string::npos || b == std::string::npos || !leader || !other) {
    v.status = FingerprintVerdict::Status::Missing;  // unreadable: treat as no verdict
    v.missing = {0};
    return v;
  }
  v.status = FingerprintVerdict::Status::Mismatch;
  v.rank = std::stoi(s.substr(0, a));
  v.leader = *leader;
  v.other = *other;
  return v;
}

// Why a wait ended early, and which ranks had not posted their fingerprint of `seq`.
FingerprintVerdict gave_up(StoreChannel& ch, uint64_t seq, int size,
                           const std::function<bool()>& stop) {
  FingerprintVerdict v;
  v.status =
      stop && stop() ? FingerprintVerdict::Status::Stopped : FingerprintVerdict::Status::Missing;
  for (int r = 0; r < size; ++r)
    if (!ch.has(fp_key(seq, std::to_string(r)))) v.missing.push_back(r);
  return v;
}

}  // namespace

FingerprintVerdict exchange_fingerprints(StoreChannel& ch, int rank, int size, const OpDesc& mine,
                                         Clock::time_point deadline,
                                         const std::function<bool()>& stop) {
  const uint64_t seq = mine.seq;
  ch.set(fp_key(seq, std::to_string(rank)), op_to_text(mine));
  // Rank 0 read our key of seq - 1 before it published that op's verdict, which we read.
  if (seq > 1) ch.erase(fp_key(seq - 1, std::to_string(rank)));
  if (rank != 0) {
    const std::string v = fp_key(seq, "v");
    if (!ch.wait_for({v}, deadline, stop)) return gave_up(ch, seq, size, stop);
    return decode_verdict(ch.get(v));
  }
  std::vector<std::string> keys;
  keys.reserve(size);
  for (int r = 0; r < size; ++r) keys.push_back(fp_key(seq, std::to_string(r)));
  if (!ch.wait_for(keys, deadline, stop)) return gave_up(ch, seq, size, stop);
  FingerprintVerdict verdict;
  for (int r = 1; r < size && verdict.status == FingerprintVerdict::Status::Agree; ++r) {
    const auto theirs = op_from_text(ch.get(keys[r]));
    if (theirs && same_fingerprint(mine, *theirs)) continue;
    verdict.status = FingerprintVerdict::Status::Mismatch;
    verdict.rank = r;
    verdict.leader = mine;
    verdict.other = theirs.value_or(OpDesc{});
  }
  ch.set(fp_key(seq, "v"), encode_verdict(verdict));
  // Every rank has read verdict seq - 1: it posted its fingerprint of seq after that.
  if (seq > 1) ch.erase(fp_key(seq - 1, "v"));
  return verdict;
}

}  // namespace lockstep::comm
