// The stream contract's host logic (cuda_stream_work.h), without a GPU: a fake StreamOps
// logs every call and simulates the streams' progress, so the tests check the order of
// record/wait, that wait() never blocks the host, that the tensors stay referenced until
// the op is known to be over, and that an enqueue error reaches every waiter.
#include <lockstep/comm/cuda_stream_work.h>
#include <lockstep/error.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

using namespace lockstep::comm::cuda;

namespace {

// Streams and events are addresses in one array, their index the id the log prints.
char g_ids[64];
void* handle(intptr_t id) { return &g_ids[id]; }
intptr_t id_of(const void* p) { return static_cast<const char*>(p) - g_ids; }
Stream stream(intptr_t id) { return handle(id); }

// Events are numbered 1, 2, ...; an event "passes" when the test says so (complete()).
class FakeOps final : public StreamOps {
 public:
  Stream current = stream(1);
  std::vector<std::string> log;
  std::map<intptr_t, bool> passed;
  std::vector<std::pair<Event, std::vector<at::Tensor>>> pending;
  int destroyed = 0, host_syncs = 0;

  Stream current_stream() override { return current; }
  Event record(Stream s) override {
    const intptr_t e = ++events_;
    passed[e] = false;
    log.push_back("record e" + std::to_string(e) + " on s" + id(s));
    return handle(e);
  }
  void wait(Stream s, Event e) override { log.push_back("s" + id(s) + " waits e" + id(e)); }
  bool query(Event e) override { return passed[id_of(e)]; }
  void synchronize(Event e) override {
    ++host_syncs;
    passed[id_of(e)] = true;
  }
  void destroy(Event) noexcept override { ++destroyed; }
  void release_after(Event e, std::vector<at::Tensor> ts) noexcept override {
    pending.emplace_back(e, std::move(ts));
  }
  void complete(intptr_t e) { passed[e] = true; }

 private:
  static std::string id(const void* p) { return std::to_string(id_of(p)); }
  intptr_t events_ = 0;
};

const Stream kCaller = stream(1), kComm = stream(7);

TEST(CudaStreamWork, OrdersCallerThenCommThenWaiter) {
  auto ops = std::make_shared<FakeOps>();
  StreamWork w(ops, kCaller, kComm, {});
  w.enqueue([&] { ops->log.emplace_back("op on s7"); });
  w.wait(stream(3));  // another stream of the caller's
  w.wait();           // the calling thread's current stream (1)
  const std::vector<std::string> want = {"record e1 on s1", "s7 waits e1", "op on s7",
                                         "record e2 on s7", "s3 waits e2", "s1 waits e2"};
  EXPECT_EQ(ops->log, want);
  EXPECT_EQ(ops->host_syncs, 0) << "wait() must not block the host";
}

TEST(CudaStreamWork, KeepsTensorsUntilTheOpIsKnownDone) {
  auto ops = std::make_shared<FakeOps>();
  at::Tensor t = at::ones({4});
  const auto uses = t.use_count();
  {
    StreamWork w(ops, kCaller, kComm, {t});
    w.enqueue([] {});
    w.wait();
    EXPECT_EQ(t.use_count(), uses + 1);
    EXPECT_FALSE(w.is_completed());
    EXPECT_EQ(w.tensors_held(), 1u) << "the comm stream may still use the tensor";
    ops->complete(2);
    EXPECT_TRUE(w.is_completed());
    EXPECT_EQ(w.tensors_held(), 0u);
    EXPECT_EQ(t.use_count(), uses);
  }
  EXPECT_TRUE(ops->pending.empty()) << "a finished op hands nothing over";
}

TEST(CudaStreamWork, DroppedEarlyHandsTensorsToTheOps) {
  auto ops = std::make_shared<FakeOps>();
  at::Tensor t = at::ones({4});
  const auto uses = t.use_count();
  {
    StreamWork w(ops, kCaller, kComm, {t});
    w.enqueue([] {});
  }  // dropped before the op ended
  ASSERT_EQ(ops->pending.size(), 1u);
  EXPECT_EQ(id_of(ops->pending[0].first), 2) << "released after `done`";
  EXPECT_EQ(t.use_count(), uses + 1);
  ops->pending.clear();
  EXPECT_EQ(t.use_count(), uses);
}

TEST(CudaStreamWork, SynchronizeBlocksAndReleases) {
  auto ops = std::make_shared<FakeOps>();
  at::Tensor t = at::ones({2});
  StreamWork w(ops, kCaller, kComm, {t});
  w.enqueue([] {});
  w.synchronize();
  EXPECT_EQ(ops->host_syncs, 1);
  EXPECT_TRUE(w.is_completed());
  EXPECT_EQ(w.tensors_held(), 0u);
}

TEST(CudaStreamWork, EnqueueErrorReachesEveryWaiter) {
  auto ops = std::make_shared<FakeOps>();
  StreamWork w(ops, kCaller, kComm, {at::ones({1})});
  w.enqueue([] { throw lockstep::Error("ncclAllReduce: unhandled cuda error"); });
  // `done` is recorded anyway, so nothing queued behind it can hang.
  EXPECT_EQ(ops->log.back(), "record e2 on s7");
  for (int i = 0; i < 2; ++i) {
    try {
      w.wait();
      ADD_FAILURE() << "wait() must rethrow the enqueue error";
    } catch (const lockstep::Error& e) {
      EXPECT_NE(std::string(e.what()).find("ncclAllReduce"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(w.is_completed(), lockstep::Error);
  EXPECT_THROW(w.synchronize(), lockstep::Error);
}

TEST(CudaStreamWork, MisuseIsRefused) {
  auto ops = std::make_shared<FakeOps>();
  StreamWork w(ops, kCaller, kComm, {});
  EXPECT_THROW(w.wait(), lockstep::InvalidArgument) << "nothing enqueued yet";
  w.enqueue([] {});
  EXPECT_THROW(w.enqueue([] {}), lockstep::InvalidArgument);
  EXPECT_THROW(StreamWork(nullptr, kCaller, kComm, {}), lockstep::InvalidArgument);
}

TEST(CudaStreamWork, EventsAreDestroyed) {
  auto ops = std::make_shared<FakeOps>();
  {
    StreamWork w(ops, kCaller, kComm, {});
    w.enqueue([] {});
    w.synchronize();
  }
  EXPECT_EQ(ops->destroyed, 2) << "ready and done";
}

}  // namespace
