// ProcessGroup front end over scripted in-process backends: validation on the
// caller's thread, ordering, avg, error context, broken groups, bounded waits.
#include <lockstep/comm/process_group.h>
#include <algorithm>

#include "comm/op_fingerprint.h"
#include "comm/store_channel.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <thread>

namespace {

using namespace lockstep;
using namespace lockstep::comm;

// A world of `size` where this rank sees every other rank holding the same tensor.
class MirrorBackend : public Backend {
 public:
  explicit MirrorBackend(int size = 2) : size_(size) {}
  std::string name() const override { return "mirror"; }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  bool checks_descriptors() const override { return true; }
  bool bounded_by_deadline() const override { return bounded; }
  void allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) override {
    EXPECT_NE(op, ReduceOp::Avg);
    order.push_back(ctx.desc.seq);
    threads.push_back(std::this_thread::get_id());
    if (op == ReduceOp::Sum) t.mul_(size_);
    if (fail_next) {
      fail_next = false;
      throw std::runtime_error("wire fell out");
    }
    if (block_next) {
      block_next = false;
      while (!aborted) std::this_thread::sleep_for(Millis(5));
    }
  }
  void broadcast(at::Tensor&, int, const OpContext&) override {}
  void allgather(at::Tensor& out, const at::Tensor& in, const OpContext&) override {
    for (int r = 0; r < size_; ++r) out.narrow(0, r * in.numel(), in.numel()).copy_(in);
  }
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp, const OpContext&) override {
    out.copy_(in.narrow(0, 0, out.numel()) * size_);
  }
  void alltoall(at::Tensor& out, const at::Tensor& in, const OpContext&) override { out.copy_(in); }
  void send(const at::Tensor&, int, int, const OpContext&) override {}
  void recv(at::Tensor&, int, int, const OpContext&) override {}
  void barrier(const OpContext&) override {}
  void abort() noexcept override { aborted = true; }

  int size_;
  std::vector<uint64_t> order;
  std::vector<std::thread::id> threads;  // who ran each allreduce
  bool bounded = false;
  bool fail_next = false;
  bool block_next = false;
  std::atomic<bool> aborted{false};
};

TEST(ProcessGroup, SumAndAvgAndOrder) {
  auto owned = std::make_unique<MirrorBackend>(4);
  auto* b = owned.get();
  ProcessGroup pg(std::move(owned));
  auto x = at::full({10}, 3.0);
  auto y = at::full({10}, 3.0);
  auto w1 = pg.allreduce(x);
  auto w2 = pg.allreduce(y, {ReduceOp::Avg});
  w1->wait();
  w2->wait();
  EXPECT_TRUE(at::allclose(x, at::full({10}, 12.0)));
  EXPECT_TRUE(at::allclose(y, at::full({10}, 3.0)));
  EXPECT_EQ(b->order, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(w1->is_completed());
  EXPECT_EQ(w2->desc().seq, 2u);
}

TEST(ProcessGroup, AllreduceCoalescedIsOneCollectiveOverTheList) {
  // MirrorBackend has no allreduce_coalesced: this runs the Backend default (flatten,
  // one allreduce, copy back, dividing on the way for Avg).
  auto owned = std::make_unique<MirrorBackend>(4);
  auto* b = owned.get();
  ProcessGroup pg(std::move(owned));
  std::vector<at::Tensor> sum{at::full({2, 3}, 1.0), at::empty({0}), at::arange(5.0)};
  std::vector<at::Tensor> avg{at::full({3}, 6.0), at::full({2, 2}, -2.0)};
  auto w1 = pg.allreduce_coalesced(sum);
  auto w2 = pg.allreduce_coalesced(avg, {ReduceOp::Avg});
  w2->wait();
  w1->wait();
  EXPECT_TRUE(at::equal(sum[0], at::full({2, 3}, 4.0)));
  EXPECT_TRUE(at::equal(sum[2], at::arange(5.0) * 4));
  EXPECT_TRUE(at::equal(avg[0], at::full({3}, 6.0)));
  EXPECT_TRUE(at::equal(avg[1], at::full({2, 2}, -2.0)));
  EXPECT_EQ(b->order, (std::vector<uint64_t>{1, 2}));  // one collective per list
  EXPECT_EQ(w1->desc().numel, 11);
  EXPECT_EQ(w2->desc().op, ReduceOp::Avg);
  EXPECT_THROW(pg.allreduce_coalesced({}), InvalidArgument);
  EXPECT_THROW(pg.allreduce_coalesced({at::ones({2}), at::ones({2}, at::kDouble)}),
               InvalidArgument);
  EXPECT_THROW(pg.allreduce_coalesced({at::ones({2}), at::ones({3, 3}).t()}), InvalidArgument);
  EXPECT_THROW(pg.allreduce_coalesced({at::ones({2}, at::kInt)}, {ReduceOp::Avg}), InvalidArgument);
}

TEST(ProcessGroup, ValidatesOnTheCallersThread) {
  ProcessGroup pg(std::make_unique<MirrorBackend>(2));
  auto strided = at::ones({4, 4}).t();
  EXPECT_THROW(pg.allreduce(strided), InvalidArgument);
  auto b = at::ones({4}, at::kBool);
  EXPECT_THROW(pg.allreduce(b), InvalidArgument);
  auto i = at::ones({4}, at::kInt);
  EXPECT_THROW(pg.allreduce(i, {ReduceOp::Avg}), InvalidArgument);
  auto in = at::ones({4});
  auto wrong = at::empty({7});
  EXPECT_THROW(pg.allgather(wrong, in), InvalidArgument);
  EXPECT_THROW(pg.reduce_scatter(in, wrong), InvalidArgument);
  auto dbl = at::empty({8}, at::kDouble);
  EXPECT_THROW(pg.allgather(dbl, in), InvalidArgument);
  EXPECT_THROW(pg.broadcast(in, {5}), InvalidArgument);
  EXPECT_THROW(pg.send(in, 0), InvalidArgument);  // to itself
  auto odd = at::ones({5});
  auto odd_out = at::empty({5});
  EXPECT_THROW(pg.alltoall(odd_out, odd), InvalidArgument);
  auto meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  try {
    pg.allreduce(meta);
    ADD_FAILURE() << "a meta tensor was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor is on meta; this process group handles CPU and "
                                         "CUDA tensors"),
              std::string::npos)
        << e.what();
  }
}

// Work::on_wait (a CUDA op's stream order, docs/gpu.md) runs on the waiting thread after a
// successful wait, every time, and never after a failed one.
// When wait() returns, the comm thread holds no reference to the op's tensors: memory the
// caller frees next is free then (FSDP returns the model's full parameters to the system
// right after its construction's broadcasts).
TEST(ProcessGroup, WaitReturnsAfterTheOpReleasedItsTensors) {
  ProcessGroup pg(std::make_unique<MirrorBackend>(2));
  int held = 0;
  for (int i = 0; i < 2000; ++i) {
    auto x = at::full({16}, 1.0);
    pg.allreduce(x)->wait();
    held += x.use_count() > 1;
  }
  EXPECT_EQ(held, 0) << "the comm thread still held the tensor after wait() " << held
                     << " times in 2000";
}

TEST(ProcessGroup, OnWaitRunsAfterEachSuccessfulWaitOnly) {
  OpDesc d{OpKind::Allreduce, 1, 4, at::kFloat, ReduceOp::Sum, -1, 0};
  int calls = 0;
  std::thread::id where;
  Work ok(d, Millis(1000), CommContext{});
  ok.on_wait([&] {
    ++calls;
    where = std::this_thread::get_id();
  });
  ok.mark_started();
  std::thread([&] { ok.finish(); }).join();
  ok.wait();
  ok.wait();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(where, std::this_thread::get_id());
  Work bad(d, Millis(1000), CommContext{});
  bad.on_wait([&] { ++calls; });
  bad.mark_started();
  bad.finish(std::make_exception_ptr(std::runtime_error("wire fell out")));
  EXPECT_THROW(bad.wait(), std::runtime_error);
  EXPECT_EQ(calls, 2);
}

TEST(ProcessGroup, FailureCarriesContextAndBreaksTheGroup) {
  auto owned = std::make_unique<MirrorBackend>(2);
  owned->fail_next = true;
  ProcessGroup pg(std::move(owned));
  auto x = at::ones({1000});
  auto w = pg.allreduce(x);
  try {
    w->wait();
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), CommError::Kind::Failed);
    EXPECT_EQ(e.context().seq, 1u);
    EXPECT_EQ(e.context().numel, 1000);
    EXPECT_NE(msg.find("rank 0/2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("allreduce #1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1000 elements float32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("wire fell out"), std::string::npos) << msg;
  }
  auto y = at::ones({3});
  EXPECT_THROW(pg.allreduce(y)->wait(), CommError);  // broken: fails at once with the cause
}

TEST(ProcessGroup, WaitIsBoundedByTheTimeout) {
  auto owned = std::make_unique<MirrorBackend>(2);
  owned->block_next = true;  // a backend that never reports (e.g. stuck in a blocking call)
  ProcessGroup pg(std::move(owned));
  auto x = at::ones({8});
  const auto t0 = Clock::now();
  auto w = pg.allreduce(x, {ReduceOp::Sum, Millis(200)});
  try {
    w->wait();
    FAIL() << "expected a timeout";
  } catch (const CommError& e) {
    EXPECT_EQ(e.kind(), CommError::Kind::Timeout);
    EXPECT_NE(std::string(e.what()).find("timeout"), std::string::npos) << e.what();
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(s, 10.0);
  // The timeout broke the group: the next op fails at once with the cause.
  EXPECT_TRUE(pg.broken());
  auto y = at::ones({8});
  try {
    pg.allreduce(y)->wait();
    FAIL() << "expected the broken group to refuse";
  } catch (const CommError& e) {
    EXPECT_EQ(e.kind(), CommError::Kind::Timeout) << e.what();
  }
}

// Work::wait runs a queued op on the waiting thread when the comm thread is idle, but
// only over a backend whose calls end by their deadline (else wait could not give up).
TEST(ProcessGroup, WaitRunsTheOpItselfOnlyOverABoundedBackend) {
  for (bool bounded : {false, true}) {
    auto owned = std::make_unique<MirrorBackend>(2);
    owned->bounded = bounded;
    MirrorBackend& b = *owned;
    ProcessGroup pg(std::move(owned));
    const int n = 200;
    for (int i = 0; i < n; ++i) {
      auto x = at::full({4}, double(i));
      pg.allreduce(x)->wait();
      ASSERT_TRUE(at::equal(x, at::full({4}, 2.0 * i)));
    }
    const auto me = std::this_thread::get_id();
    const long here = std::count(b.threads.begin(), b.threads.end(), me);
    ASSERT_EQ(b.order.size(), size_t(n));
    for (int i = 0; i < n; ++i) EXPECT_EQ(b.order[i], uint64_t(i + 1));  // still in order
    if (bounded)
      EXPECT_GT(here, 0) << "the waiting thread never ran an op itself";
    else
      EXPECT_EQ(here, 0) << "an op ran outside the comm thread over an unbounded backend";
  }
}

TEST(ProcessGroup, AvgOnATensorThatRequiresGrad) {
  ProcessGroup pg(std::make_unique<MirrorBackend>(4));
  auto w = at::full({6}, 2.0).set_requires_grad(true);
  pg.allreduce(w, {ReduceOp::Avg})->wait();  // the comm thread records no autograd history
  EXPECT_TRUE(at::allclose(w.detach(), at::full({6}, 2.0)));
}

TEST(ProcessGroup, IssuingFromACompositeBodyIsAnErrorNotADeadlock) {
  // Over a bounded backend the body may run on the waiting thread itself (run here).
  for (bool bounded : {false, true}) {
    auto owned = std::make_unique<MirrorBackend>(2);
    owned->bounded = bounded;
    ProcessGroup pg(std::move(owned));
    auto x = at::ones({4});
    auto w = pg.run_composite(4, at::kFloat, [&](Backend&, const OpContext&) { pg.allreduce(x); });
    try {
      w->wait();
      FAIL() << "expected an error (bounded " << bounded << ")";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("comm thread"), std::string::npos) << e.what();
    }
  }
}

TEST(ProcessGroup, AbortBreaksTheGroupWithTheCause) {
  auto owned = std::make_unique<MirrorBackend>(2);
  auto* b = owned.get();
  ProcessGroup pg(std::move(owned));
  pg.abort(std::make_exception_ptr(Error("backward failed half-way")));
  EXPECT_TRUE(b->aborted);
  auto x = at::ones({4});
  try {
    pg.allreduce(x)->wait();
    FAIL() << "expected the cause";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("half-way"), std::string::npos) << e.what();
  }
}

TEST(ProcessGroup, DescriptorCheckNamesTheDifferingRank) {
  // Without backend-side checks the group allgathers descriptors; the mirror backend
  // returns ours for every rank, so a consistent op passes.
  struct Unchecked : MirrorBackend {
    bool checks_descriptors() const override { return false; }
  };
  ProcessGroup pg(std::make_unique<Unchecked>());
  auto x = at::ones({5});
  EXPECT_NO_THROW(pg.allreduce(x)->wait());
  OpDesc a{OpKind::Allreduce, 4, 1000, at::kFloat, ReduceOp::Sum, -1, 0};
  OpDesc b = a;
  b.numel = 999;
  EXPECT_EQ(describe_mismatch(0, a, 1, b),
            "rank 0 entered allreduce #4 (float32, 1000, sum) but rank 1 entered allreduce #4 "
            "(float32, 999, sum) (every rank must issue the same collectives, in the same order, "
            "with the same sizes, dtypes and roots)");
}

// LOCKSTEP_DEBUG=DETAIL with a side store: the group checks through the store instead of
// the allgather. A thread plays rank 1, entering barrier #2 where this rank enters an
// allreduce: the group raises Mismatch naming both, and the backend never runs the op.
TEST(ProcessGroup, DetailChecksThroughTheStore) {
  struct Unchecked : MirrorBackend {
    bool checks_descriptors() const override { return false; }
    void allgather(at::Tensor&, const at::Tensor&, const OpContext&) override { ++allgathers; }
    int allgathers = 0;
  };
  auto store = c10::make_intrusive<c10d::HashStore>();
  ProcessGroupOptions o;
  o.check_collectives = false;
  o.detail = true;
  o.side_store = std::make_shared<StoreChannel>(store, "g/");
  auto owned = std::make_unique<Unchecked>();
  auto* b = owned.get();
  ProcessGroup pg(std::move(owned), o);
  std::thread peer([&] {
    StoreChannel ch(store, "g/");
    OpDesc first{OpKind::Allreduce, 1, 5, at::kFloat, ReduceOp::Sum, -1, 0};
    OpDesc second{OpKind::Barrier, 2, 0, at::kByte, ReduceOp::Sum, -1, 0};
    for (const OpDesc& d : {first, second})
      exchange_fingerprints(ch, 1, 2, d, Clock::now() + Millis(5000), {});
  });
  auto x = at::ones({5});
  EXPECT_NO_THROW(pg.allreduce(x)->wait());
  try {
    pg.allreduce(x)->wait();
    ADD_FAILURE() << "expected Mismatch";
  } catch (const CommError& e) {
    EXPECT_EQ(e.kind(), CommError::Kind::Mismatch);
    EXPECT_NE(std::string(e.what()).find(
                  "rank 0 entered allreduce #2 (float32, 5, sum) but rank 1 entered barrier #2"),
              std::string::npos)
        << e.what();
  }
  peer.join();
  EXPECT_EQ(b->allgathers, 0);     // no allgather check
  EXPECT_EQ(b->order.size(), 1u);  // only the agreed op ran
}

}  // namespace
