// Op fingerprints and the stall inspector (docs/debugging.md): how ops and mismatches are
// described, the store-based check of LOCKSTEP_DEBUG=DETAIL between threads standing in
// for ranks, and the stall reports of both the segment view (shm) and the store protocol.
#include "comm/op_fingerprint.h"
#include "comm/stall_inspector.h"
#include "comm/store_channel.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using namespace lockstep::comm;
using Status = FingerprintVerdict::Status;

OpDesc op(OpKind k, uint64_t seq, int64_t numel = 0, at::ScalarType t = at::kFloat,
          ReduceOp r = ReduceOp::Sum, int root = -1) {
  OpDesc d;
  d.kind = k;
  d.seq = seq;
  d.numel = numel;
  d.dtype = t;
  d.op = r;
  d.root = root;
  return d;
}

TEST(OpFingerprint, DescribesEachKind) {
  EXPECT_EQ(describe_op(op(OpKind::Allgather, 12, 1024)), "allgather #12 (float32, 1024)");
  EXPECT_EQ(describe_op(op(OpKind::Barrier, 12)), "barrier #12");
  EXPECT_EQ(describe_op(op(OpKind::Allreduce, 3, 1000, at::kDouble, ReduceOp::Max)),
            "allreduce #3 (float64, 1000, max)");
  EXPECT_EQ(describe_op(op(OpKind::ReduceScatter, 4, 8, at::kBFloat16, ReduceOp::Avg)),
            "reduce_scatter #4 (bfloat16, 8, avg)");
  EXPECT_EQ(describe_op(op(OpKind::Broadcast, 5, 8, at::kLong, ReduceOp::Sum, 1)),
            "broadcast #5 (int64, 8, root 1)");
  OpDesc c = op(OpKind::Composite, 7, 4096);
  c.fingerprint = 42;
  EXPECT_EQ(describe_op(c), "composite #7 (float32, 4096, options 42)");
}

TEST(OpFingerprint, EveryFieldCounts) {
  const OpDesc a = op(OpKind::Allreduce, 4, 1000, at::kFloat, ReduceOp::Sum, -1);
  EXPECT_TRUE(same_fingerprint(a, a));
  std::vector<std::function<void(OpDesc&)>> changes = {
      [](OpDesc& d) { d.kind = OpKind::Allgather; },
      [](OpDesc& d) { d.seq = 5; },
      [](OpDesc& d) { d.numel = 999; },
      [](OpDesc& d) { d.dtype = at::kDouble; },
      [](OpDesc& d) { d.op = ReduceOp::Max; },
      [](OpDesc& d) { d.root = 1; },
      [](OpDesc& d) { d.fingerprint = 9; }};
  for (size_t i = 0; i < changes.size(); ++i) {
    OpDesc b = a;
    changes[i](b);
    EXPECT_FALSE(same_fingerprint(a, b)) << "change " << i;
  }
  // The tag of a send/recv is not part of a collective's fingerprint.
  OpDesc t = a;
  t.tag = 3;
  EXPECT_TRUE(same_fingerprint(a, t));
}

TEST(OpFingerprint, MismatchNamesBothSides) {
  EXPECT_EQ(describe_mismatch(0, op(OpKind::Allgather, 12, 1024), 1, op(OpKind::Barrier, 12)),
            "rank 0 entered allgather #12 (float32, 1024) but rank 1 entered barrier #12 (every "
            "rank must issue the same collectives, in the same order, with the same sizes, dtypes "
            "and roots)");
  OpDesc a = op(OpKind::Composite, 7, 4096), b = a;
  a.fingerprint = 1;
  b.fingerprint = 2;
  const std::string m = describe_mismatch(0, a, 2, b);
  EXPECT_NE(m.find("different options"), std::string::npos) << m;
  // Options differ only as part of other differences: no hint.
  b.numel = 1;
  EXPECT_EQ(describe_mismatch(0, a, 2, b).find("different options"), std::string::npos);
}

TEST(OpFingerprint, PackedAndTextFormsRoundTrip) {
  OpDesc a = op(OpKind::Broadcast, 123456789012ULL, int64_t{1} << 40, at::kHalf, ReduceOp::Min, 3);
  a.fingerprint = -77;
  const PackedOp p = pack_op(a);
  EXPECT_TRUE(same_fingerprint(unpack_op(p.data()), a));
  const auto back = op_from_text(op_to_text(a));
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(same_fingerprint(*back, a));
  for (const char* bad : {"", "1 2 3", "1 2 3 4 5 6 x", "1 2 3 4 5 6 7 8"})
    EXPECT_FALSE(op_from_text(bad).has_value()) << bad;
}

// ---- LOCKSTEP_DEBUG=DETAIL's exchange through the store, ranks as threads ------------

struct Ranks {
  explicit Ranks(int n) : size(n), store(c10::make_intrusive<c10d::HashStore>()) {}
  int size;
  c10::intrusive_ptr<c10d::Store> store;
  // Every rank (thread) exchanges ops[rank]; returns each rank's verdict.
  std::vector<FingerprintVerdict> exchange(const std::vector<OpDesc>& ops, Millis limit,
                                           std::vector<bool> absent = {}) const {
    std::vector<FingerprintVerdict> out(size);
    std::vector<std::thread> ts;
    absent.resize(size, false);
    for (int r = 0; r < size; ++r) {
      if (absent[r]) continue;
      ts.emplace_back([&, r] {
        StoreChannel ch(store, "g/");
        out[r] = exchange_fingerprints(ch, r, size, ops[r], Clock::now() + limit, {});
      });
    }
    for (auto& t : ts) t.join();
    return out;
  }
};

TEST(FingerprintExchange, AgreementAndMismatchReachEveryRank) {
  Ranks w(3);
  const OpDesc a = op(OpKind::Allreduce, 1, 100);
  for (const auto& v : w.exchange({a, a, a}, Millis(5000))) EXPECT_EQ(v.status, Status::Agree);
  OpDesc b = op(OpKind::Barrier, 2), c = op(OpKind::Allgather, 2, 64);
  const auto vs = w.exchange({b, b, c}, Millis(5000));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(vs[r].status, Status::Mismatch) << r;
    EXPECT_EQ(vs[r].rank, 2);
    EXPECT_EQ(describe_mismatch(0, vs[r].leader, vs[r].rank, vs[r].other),
              describe_mismatch(0, b, 2, c));
  }
}

TEST(FingerprintExchange, KeysStayBounded) {
  Ranks w(3);
  for (uint64_t seq = 1; seq <= 20; ++seq) {
    const OpDesc a = op(OpKind::Allreduce, seq, 10);
    for (const auto& v : w.exchange({a, a, a}, Millis(5000))) ASSERT_EQ(v.status, Status::Agree);
  }
  // Two ops' keys at most: 3 fingerprints and a verdict each.
  const int64_t keys = w.store->getNumKeys();
  std::printf("keys left after 20 ops on 3 ranks: %lld\n", static_cast<long long>(keys));
  EXPECT_LE(keys, 2 * (3 + 1));
}

TEST(FingerprintExchange, AnAbsentRankIsNamed) {
  Ranks w(3);
  const OpDesc a = op(OpKind::Allreduce, 1, 10);
  const auto start = Clock::now();
  const auto vs = w.exchange({a, a, a}, Millis(300), {false, false, true});
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(took, 2.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(vs[r].status, Status::Missing) << r;
    EXPECT_EQ(vs[r].missing, std::vector<int>{2}) << r;
  }
}

TEST(FingerprintExchange, StopEndsTheWait) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  StoreChannel ch(store, "g/");
  std::atomic<bool> stop{false};
  std::thread t([&] {
    std::this_thread::sleep_for(Millis(50));
    stop = true;
  });
  const auto v = exchange_fingerprints(ch, 0, 2, op(OpKind::Barrier, 1),
                                       Clock::now() + Millis(10000), [&] { return stop.load(); });
  t.join();
  EXPECT_EQ(v.status, Status::Stopped);
  EXPECT_EQ(v.missing, std::vector<int>{1});
}

// ---- the stall inspector -----------------------------------------------------------

RankActivity seen(const OpDesc& last, bool in_op = false, double since = -1) {
  RankActivity a;
  a.known = true;
  a.last = last;
  a.in_op_known = since >= 0;
  a.in_op = in_op;
  a.since_s = since;
  return a;
}

TEST(StallReport, FindsTheRanksBehind) {
  const OpDesc n3 = op(OpKind::Allreduce, 3, 16), n4 = op(OpKind::Allreduce, 4, 1000, at::kDouble);
  std::vector<RankActivity> ranks = {seen(n4, true, 61), seen(n3, false, 62), seen(n4, true, 60),
                                     RankActivity{}};
  const StallFinding f = find_stall(ranks);
  EXPECT_EQ(f.op.seq, 4u);
  EXPECT_EQ(f.entered, (std::vector<int>{0, 2}));
  EXPECT_EQ(f.missing, (std::vector<int>{1, 3}));
  EXPECT_DOUBLE_EQ(waited_in(f, ranks), 61);
  const std::string text = format_stall(f, ranks, 61, 60, 300);
  std::printf("%s", text.c_str());
  EXPECT_EQ(text,
            "lockstep: stall: allreduce #4 (float64, 1000, sum) has waited 61.0 s for ranks 1, 3 "
            "(entered by ranks 0, 2; it times out after 300.0 s, this warning repeats every 60.0 "
            "s, LOCKSTEP_STALL_WARN_S)\n"
            "lockstep: stall:   rank 1 last entered allreduce #3 (float32, 16, sum), 62.0 s ago\n"
            "lockstep: stall:   rank 3 did not answer (stopped, dead, or stuck outside "
            "lockstep's calls)\n");
  // Every rank in the same op (or all idle): no stall.
  EXPECT_EQ(find_stall({seen(n4), seen(n4)}).op.seq, 0u);
  EXPECT_EQ(find_stall({seen(OpDesc{}), seen(OpDesc{})}).op.seq, 0u);
}

TEST(StallReport, NamesADisagreementAmongTheRanksInside) {
  const OpDesc a = op(OpKind::Allreduce, 4, 1000), b = op(OpKind::Allreduce, 4, 999);
  std::vector<RankActivity> ranks = {seen(a, true, 5), seen(b, true, 5), seen(OpDesc{})};
  const std::string text = format_stall(find_stall(ranks), ranks, 5, 1, 300);
  EXPECT_NE(text.find("rank 2 has entered no collective yet"), std::string::npos) << text;
  EXPECT_NE(
      text.find("disagree on it: rank 0 entered allreduce #4 (float32, 1000, sum) but rank 1"),
      std::string::npos)
      << text;
}

TEST(StallReport, ActivityTextRoundTrips) {
  const RankActivity a = seen(op(OpKind::Broadcast, 9, 5, at::kInt, ReduceOp::Sum, 2), true, 1.5);
  int64_t q = 0;
  const auto b = activity_from_text(activity_to_text(a, 17), q);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(q, 17);
  EXPECT_TRUE(b->known && b->in_op && b->in_op_known);
  EXPECT_DOUBLE_EQ(b->since_s, 1.5);
  EXPECT_TRUE(same_fingerprint(b->last, a.last));
  EXPECT_FALSE(activity_from_text("x", q).has_value());
}

// Reports collected from an inspector's print hook.
struct Printed {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> hook() {
    return [this](const std::string& s) {
      std::lock_guard<std::mutex> l(mu);
      lines.push_back(s);
    };
  }
  std::string all() {
    std::lock_guard<std::mutex> l(mu);
    std::string s;
    for (auto& x : lines) s += x;
    return s;
  }
  size_t count() {
    std::lock_guard<std::mutex> l(mu);
    return lines.size();
  }
};

TEST(StallInspector, SegmentViewReportsAndRepeats) {
  Printed out;
  const auto start = Clock::now();
  StallInspector::Config c;
  c.rank = 0;
  c.size = 3;
  c.warn_s = 0.2;
  c.local = [&]() -> std::optional<RankActivity> {
    return seen(op(OpKind::Allreduce, 4, 8), true,
                std::chrono::duration<double>(Clock::now() - start).count());
  };
  c.peers = [] {
    return std::vector<OpDesc>{OpDesc{}, op(OpKind::Allreduce, 4, 8), op(OpKind::Barrier, 3)};
  };
  c.print = out.hook();
  {
    StallInspector inspector(c);
    std::this_thread::sleep_for(Millis(700));
  }
  const std::string text = out.all();
  std::printf("%zu reports in 0.7 s at warn 0.2 s; the first:\n%s", out.count(),
              out.lines.empty() ? "" : out.lines[0].c_str());
  EXPECT_GE(out.count(), 2u);
  EXPECT_LE(out.count(), 4u);
  EXPECT_NE(text.find("allreduce #4 (float32, 8, sum) has waited"), std::string::npos) << text;
  EXPECT_NE(text.find("for rank 2 (entered by ranks 0, 1"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 last entered barrier #3\n"), std::string::npos) << text;
}

TEST(StallInspector, QuietWithoutAStall) {
  Printed out;
  StallInspector::Config c;
  c.rank = 0;
  c.size = 2;
  c.warn_s = 0.1;
  c.local = []() -> std::optional<RankActivity> { return seen(op(OpKind::Barrier, 9), false, 5); };
  c.peers = [] { return std::vector<OpDesc>{OpDesc{}, op(OpKind::Barrier, 9)}; };
  c.print = out.hook();
  {
    StallInspector inspector(c);
    std::this_thread::sleep_for(Millis(400));
  }
  EXPECT_EQ(out.count(), 0u) << out.all();
}

// The store protocol: rank 0 waits in op #4 while rank 1 (not in any op) lags behind; and
// the other way round, where rank 0 must learn of the stall from rank 1's question.
void store_protocol(int late) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  Printed out0, out1;
  const auto start = Clock::now();
  std::vector<std::unique_ptr<StallInspector>> inspectors;
  for (int r = 0; r < 2; ++r) {
    StallInspector::Config c;
    c.rank = r;
    c.size = 2;
    c.warn_s = 0.4;
    c.local = [&, r]() -> std::optional<RankActivity> {
      const double t = std::chrono::duration<double>(Clock::now() - start).count();
      if (r == late) return seen(op(OpKind::Barrier, 3), false, t + 1);
      return seen(op(OpKind::Allreduce, 4, 8), true, t);
    };
    c.store = std::make_shared<StoreChannel>(store, "g/side/");
    c.print = (r == 0 ? out0 : out1).hook();
    inspectors.push_back(std::make_unique<StallInspector>(c));
  }
  std::this_thread::sleep_for(Millis(1100));
  inspectors.clear();
  const std::string text = out0.all();
  std::printf("late rank %d: %zu reports from rank 0 in 1.1 s at warn 0.4 s; the first:\n%s", late,
              out0.count(), out0.lines.empty() ? "" : out0.lines[0].c_str());
  EXPECT_GE(out0.count(), 1u);
  EXPECT_EQ(out1.count(), 0u) << "only rank 0 reports: " << out1.all();
  const std::string want =
      "for rank " + std::to_string(late) + " (entered by rank " + std::to_string(1 - late) + ";";
  EXPECT_NE(text.find(want), std::string::npos) << text;
  EXPECT_NE(text.find("rank " + std::to_string(late) + " last entered barrier #3, "),
            std::string::npos)
      << text;
}

TEST(StallInspector, StoreProtocolLateRank1) { store_protocol(1); }
TEST(StallInspector, StoreProtocolLateRank0) { store_protocol(0); }

TEST(StallInspector, AloneReportsItsOwnWait) {
  Printed out;
  StallInspector::Config c;
  c.rank = 1;
  c.size = 2;
  c.warn_s = 0.1;
  c.local = []() -> std::optional<RankActivity> {
    return seen(op(OpKind::Allreduce, 2, 8), true, 10);
  };
  c.print = out.hook();
  {
    StallInspector inspector(c);
    std::this_thread::sleep_for(Millis(300));
  }
  EXPECT_NE(out.all().find("rank 1 has waited 10.0 s in allreduce #2 (float32, 8, sum)"),
            std::string::npos)
      << out.all();
}

}  // namespace
