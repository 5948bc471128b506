// The quorum service's rules (src/launch/quorum_state.h), event by event, with a clock of
// the test's own: who is in a quorum, when it forms, what its id and step are, how votes
// are decided, and when the job stops. The server around it and real replicas:
// tests/fault/ft_test.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "launch/coordinator.h"
#include "launch/quorum_state.h"
#include "lockstep/quorum_wire.h"

using namespace lockstep::launch;
using lockstep::quorum_wire::Quorum;
using Clock = QuorumState::Clock;
using std::chrono::milliseconds;

namespace {

struct Harness {
  explicit Harness(QuorumConfig c) : st(c) {}
  QuorumState st;
  Clock::time_point now = Clock::now();
  std::vector<QuorumState::Message> sent;

  void join(int conn) { st.hello(conn, conn, "127.0.0.1", 1000 + conn, now); }
  void tick(int ms = 0) {
    now += milliseconds(ms);
    for (int c = 0; c < 16; ++c) st.heard(c, now);  // everyone alive heartbeats
    auto m = st.advance(now);
    sent.insert(sent.end(), m.begin(), m.end());
  }
  // The lines sent to `conn` since the last take, oldest first (after the server's pass
  // over the state, as after every batch of events).
  std::vector<std::string> take(int conn) {
    tick();
    std::vector<std::string> out, rest;
    for (auto& m : sent) (m.conn == conn ? out : rest).push_back(m.line);
    std::vector<QuorumState::Message> keep;
    for (auto& m : sent)
      if (m.conn != conn) keep.push_back(m);
    sent = keep;
    return out;
  }
  Quorum quorum_of(int conn) {
    auto lines = take(conn);
    EXPECT_EQ(lines.size(), 1u);
    Quorum q;
    EXPECT_TRUE(!lines.empty() && lockstep::quorum_wire::parse_quorum(lines.back(), &q))
        << (lines.empty() ? "" : lines.back());
    return q;
  }
};

QuorumConfig config(int expected, int min_replicas = 1) {
  QuorumConfig c;
  c.expected = expected;
  c.min_replicas = min_replicas;
  c.join_wait = milliseconds(5000);
  c.heartbeat_timeout = milliseconds(3000);
  c.straggler_wait = milliseconds(60000);
  return c;
}

TEST(Quorum, WireRoundTrip) {
  Quorum q;
  q.id = 4;
  q.max_step = 17;
  q.members = {{0, 17, "10.0.0.1", 4000}, {3, 12, "::1", 5000}};
  Quorum back;
  ASSERT_TRUE(lockstep::quorum_wire::parse_quorum(lockstep::quorum_wire::format_quorum(q), &back));
  EXPECT_EQ(back.id, 4);
  EXPECT_EQ(back.max_step, 17);
  ASSERT_EQ(back.members.size(), 2u);
  EXPECT_EQ(back.members[1].host, "::1");
  EXPECT_EQ(back.members[1].port, 5000);
  EXPECT_EQ(back.members[1].step, 12);
  EXPECT_FALSE(lockstep::quorum_wire::parse_quorum("QUORUM 1 2 3 0:0:h:1", &back));
  EXPECT_FALSE(lockstep::quorum_wire::parse_quorum("VOTE 1 2 1", &back));
}

TEST(Quorum, FirstQuorumWaitsForTheExpectedReplicas) {
  Harness h(config(3));
  for (int c = 0; c < 3; ++c) h.join(c);
  h.st.request(0, 0, h.now);
  h.st.request(1, 0, h.now);
  h.tick(100);
  EXPECT_TRUE(h.sent.empty()) << "formed with 2 of the 3 expected";
  h.st.request(2, 0, h.now);
  h.tick();
  for (int c = 0; c < 3; ++c) {
    Quorum q = h.quorum_of(c);
    EXPECT_EQ(q.id, 1);
    EXPECT_EQ(q.members.size(), 3u);
    EXPECT_EQ(q.members[c].port, 1000 + c);
  }
}

TEST(Quorum, FirstQuorumFormsWithWhoCameAfterTheJoinWait) {
  Harness h(config(3));
  h.join(0);
  h.join(1);
  h.st.request(0, 0, h.now);
  h.st.request(1, 0, h.now);
  h.tick(4999);
  EXPECT_TRUE(h.sent.empty());
  h.tick(2);
  EXPECT_EQ(h.quorum_of(0).members.size(), 2u);
}

// Replicas 0..n-1 ask for step `step`'s quorum and get it; returns its id.
int64_t ask_all(Harness& h, int n, int64_t step) {
  for (int c = 0; c < n; ++c) h.st.request(c, step, h.now);
  h.tick(10);
  int64_t id = 0;
  for (int c = 0; c < n; ++c) id = h.quorum_of(c).id;
  return id;
}

// Forms a 3-replica quorum at step 0 and commits `steps` steps; returns the quorum id.
int64_t run_steps(Harness& h, int steps, const std::vector<int>& conns = {0, 1, 2}) {
  int64_t id = 0;
  for (int s = 0; s < steps; ++s) {
    for (int c : conns) h.st.request(c, s, h.now);
    h.tick(10);
    for (int c : conns) id = h.quorum_of(c).id;
    for (int c : conns) h.st.vote(c, id, s, true, h.now);
    for (int c : conns)
      EXPECT_EQ(h.take(c), std::vector<std::string>{"VOTE " + std::to_string(id) + " " +
                                                    std::to_string(s) + " 1"});
  }
  return id;
}

TEST(Quorum, SameMembersKeepTheQuorumId) {
  Harness h(config(3));
  for (int c = 0; c < 3; ++c) h.join(c);
  EXPECT_EQ(run_steps(h, 5), 1);
}

TEST(Quorum, AMemberLostMidVoteFailsTheStepEverywhereAndRenewsTheQuorum) {
  Harness h(config(3));
  for (int c = 0; c < 3; ++c) h.join(c);
  run_steps(h, 2);
  ask_all(h, 3, 2);
  h.st.vote(0, 1, 2, true, h.now);  // replica 0 reduced fine, then replica 2 dies
  h.st.lost(2);
  h.tick();
  EXPECT_EQ(h.take(0), std::vector<std::string>{"VOTE 1 2 0"});
  h.st.vote(1, 1, 2, false, h.now);
  EXPECT_EQ(h.take(1), std::vector<std::string>{"VOTE 1 2 0"});
  // The survivors' next quorum: a new id, the two of them, still at step 2.
  h.st.request(0, 2, h.now);
  h.st.request(1, 2, h.now);
  h.tick(10);
  Quorum q = h.quorum_of(0);
  EXPECT_EQ(q.id, 2);
  EXPECT_EQ(q.max_step, 2);
  EXPECT_EQ(q.members.size(), 2u);
}

TEST(Quorum, AVoteAfterTheLossIsStillRefused) {
  // The loss came before anyone voted: the members' later votes must not wait for it.
  Harness h(config(3));
  for (int c = 0; c < 3; ++c) h.join(c);
  run_steps(h, 1);
  ask_all(h, 3, 1);
  h.st.lost(2);
  h.tick();
  h.st.vote(0, 1, 1, true, h.now);
  EXPECT_EQ(h.take(0), std::vector<std::string>{"VOTE 1 1 0"});
  h.st.vote(1, 1, 1, true, h.now);
  EXPECT_EQ(h.take(1), std::vector<std::string>{"VOTE 1 1 0"});
}

TEST(Quorum, AFailedVoteRenewsTheIdEvenWithTheSameMembers) {
  Harness h(config(2));
  h.join(0);
  h.join(1);
  run_steps(h, 1, {0, 1});
  ask_all(h, 2, 1);
  h.st.vote(0, 1, 1, false, h.now);  // a timeout on replica 0, nobody died
  h.st.vote(1, 1, 1, true, h.now);
  EXPECT_EQ(h.take(0), std::vector<std::string>{"VOTE 1 1 0"});
  EXPECT_EQ(h.take(1), std::vector<std::string>{"VOTE 1 1 0"});
  for (int c = 0; c < 2; ++c) h.st.request(c, 1, h.now);
  h.tick(10);
  EXPECT_EQ(h.quorum_of(0).id, 2) << "members keep a group that may be broken";
}

TEST(Quorum, ARestartedReplicaIsNotItsFormerSelf) {
  // Replica 2 dies after the quorum formed and before anyone voted; its restart connects
  // with the same id. The survivors' vote must not wait for the newcomer, which never
  // joined that quorum (found by lockstep-bench faults: a soak that stopped dead).
  Harness h(config(3));
  for (int c = 0; c < 3; ++c) h.join(c);
  run_steps(h, 2);
  ask_all(h, 3, 2);
  h.st.lost(2);
  h.st.hello(9, 2, "127.0.0.1", 1009, h.now);  // replica 2 again, a new connection
  h.st.request(9, 0, h.now);
  h.st.vote(0, 1, 2, true, h.now);
  h.st.vote(1, 1, 2, true, h.now);
  EXPECT_EQ(h.take(0), std::vector<std::string>{"VOTE 1 2 0"});
  EXPECT_EQ(h.take(1), std::vector<std::string>{"VOTE 1 2 0"});
  // The next quorum: a new id, replica 2's new incarnation behind, to be healed.
  h.st.request(0, 2, h.now);
  h.st.request(1, 2, h.now);
  h.tick(10);
  Quorum q = h.quorum_of(9);
  EXPECT_EQ(q.id, 2);
  EXPECT_EQ(q.max_step, 2);
  ASSERT_EQ(q.members.size(), 3u);
  EXPECT_EQ(q.members[2].step, 0);
}

TEST(Quorum, AJoinerWaitsForTheMembersAndGetsTheirStep) {
  Harness h(config(2));
  h.join(0);
  h.join(1);
  run_steps(h, 3, {0, 1});
  h.join(5);
  h.st.request(5, 0, h.now);  // a fresh replica: step 0
  h.tick(1000);
  EXPECT_TRUE(h.take(5).empty()) << "a joiner must not hold up or bypass the members";
  h.st.request(0, 3, h.now);
  h.st.request(1, 3, h.now);
  h.tick(10);
  Quorum q = h.quorum_of(5);
  EXPECT_EQ(q.id, 2);
  EXPECT_EQ(q.max_step, 3) << "the joiner heals to the members' step";
  ASSERT_EQ(q.members.size(), 3u);
  EXPECT_EQ(q.members[2].id, 5);
  EXPECT_EQ(q.members[2].step, 0);
}

TEST(Quorum, NeverGoesBackBehindTheCommittedStep) {
  // A fresh replica must not restart the job from step 0 on its own while a replica that
  // holds the state is alive but busy; once every holder is gone, the job stops, saying so.
  Harness h(config(3));
  for (int c = 0; c < 3; ++c) h.join(c);
  run_steps(h, 4);
  h.st.lost(0);
  h.st.lost(1);
  h.join(5);
  h.st.request(5, 0, h.now);
  h.tick(30000);
  EXPECT_TRUE(h.take(5).empty()) << "replica 2 holds step 4's state and will ask";
  EXPECT_FALSE(h.st.stopped());
  h.st.lost(2);
  h.tick();
  ASSERT_TRUE(h.st.stopped());
  EXPECT_EQ(h.st.stop_reason().rfind("every replica that held step 4's state is gone", 0), 0u)
      << h.st.stop_reason();
}

TEST(Quorum, ALatecomerToAFinishedJobIsToldItIsDone) {
  Harness h(config(2));
  h.join(0);
  h.join(1);
  run_steps(h, 4, {0, 1});
  h.st.bye(0, 4);
  EXPECT_TRUE(h.st.finished());
  EXPECT_FALSE(h.st.all_left());  // replica 1 is still there
  h.st.bye(1, 4);
  EXPECT_TRUE(h.st.all_left());  // every replica left cleanly: the service may end
  h.join(2);                     // restarted too slowly: the others finished
  h.st.request(2, 0, h.now);
  EXPECT_EQ(h.take(2), std::vector<std::string>{"DONE 4"});
}

TEST(Quorum, SilentReplicaIsLostAfterTheHeartbeatTimeout) {
  Harness h(config(2));
  h.join(0);
  h.join(1);
  run_steps(h, 1, {0, 1});
  h.now += milliseconds(2000);
  h.st.heard(0, h.now);
  auto m = h.st.advance(h.now);
  EXPECT_TRUE(h.st.take_closed().empty());
  h.now += milliseconds(1500);  // replica 1: 3.5 s silent; replica 0: 1.5 s
  h.st.heard(0, h.now);
  h.st.advance(h.now);
  EXPECT_EQ(h.st.take_closed(), std::vector<int>{1});
  bool logged = false;
  for (const auto& l : h.st.take_log())
    logged = logged || l.find("replica 1 lost: no heartbeat") == 0;
  EXPECT_TRUE(logged);
}

// Three replicas make a step, `gone` is lost, the other two ask for the next: the reason of
// the stop that follows (empty when there is none).
std::string reason_below_min(Harness& h, int gone) {
  run_steps(h, 1);
  h.st.lost(gone);
  for (int c = 0; c < 3; ++c)
    if (c != gone) h.st.request(c, 1, h.now);
  h.tick(10);
  EXPECT_TRUE(h.st.stopped());
  return h.st.stop_reason();
}

// A replica's own minimum (fault_tolerance.min_replicas) raises --min-replicas and the STOP
// names whose it was.
TEST(Quorum, AReplicasMinimumRaisesTheJobsAndIsNamed) {
  Harness h(config(3, 1));
  for (int c = 0; c < 3; ++c) h.st.hello(c, c, "127.0.0.1", 1000 + c, h.now, c == 1 ? 3 : 2);
  EXPECT_EQ(h.st.min_replicas(), 3);
  EXPECT_EQ(reason_below_min(h, 0),
            "fewer than min_replicas (replica 1's) 3 replicas remain (2: 1,2)");
}

TEST(Quorum, FewerThanMinReplicasStopsTheJobNamingWhy) {
  Harness h(config(3, 3));
  for (int c = 0; c < 3; ++c) h.join(c);
  EXPECT_EQ(reason_below_min(h, 2), "fewer than --min-replicas 3 replicas remain (2: 0,1)");
  EXPECT_EQ(h.take(0), std::vector<std::string>{"STOP " + h.st.stop_reason()});
  h.join(7);  // later arrivals learn it too
  h.tick();
  EXPECT_EQ(h.take(7), std::vector<std::string>{"STOP " + h.st.stop_reason()});
}

TEST(Quorum, ByeIsNotALossButFailsAnOpenVote) {
  Harness h(config(2));
  h.join(0);
  h.join(1);
  run_steps(h, 1, {0, 1});
  h.st.bye(0, 1);
  bool left = false;
  for (const auto& l : h.st.take_log()) left = left || l == "replica 0 left (done after 1 steps)";
  EXPECT_TRUE(left);
  h.st.request(1, 1, h.now);
  h.tick(10);
  EXPECT_EQ(h.quorum_of(1).members.size(), 1u);
}

}  // namespace

// A node without the service asks it before restarting a replica (coordinator.h).
TEST(QuorumService, ReachableWhileListeningAndNotAfter) {
  int port = 0;
  const int fd = lockstep::launch::listen_on("127.0.0.1", 0, &port);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  EXPECT_TRUE(lockstep::launch::service_reachable(address, 1000));
  ::close(fd);
  const auto t0 = Clock::now();
  EXPECT_FALSE(lockstep::launch::service_reachable(address, 300));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));  // gives up after its window
  EXPECT_FALSE(lockstep::launch::service_reachable("no-port-here", 100));
}
