// quorum_state.h (internal): the quorum service's rules, without sockets or clocks of its
// own, so they can be tested event by event (tests/unit/test_launch_quorum.cpp). The
// server (coordinator.cpp) feeds it what arrives on each connection and sends what it
// says. Rules and timings: docs/fault-tolerance.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lockstep/quorum_wire.h"

namespace lockstep::launch {

struct QuorumConfig {
  using Millis = std::chrono::milliseconds;
  int min_replicas = 1;  // fewer members than this: the job stops (STOP to everyone)
  int expected = 1;      // the first quorum waits for this many replicas ...
  Millis join_wait{std::chrono::seconds(300)};  // ... at most this long after the first asks
  // A replica silent this long (no heartbeat, no request) is lost; its connection is closed.
  Millis heartbeat_timeout{std::chrono::seconds(3)};
  // Once a quorum has formed, a new one waits for the previous one's members that are
  // still alive; a member that does not ask within this long after the first did is left
  // out (it is alive but stuck). Joiners never hold a quorum up.
  Millis straggler_wait{std::chrono::seconds(60)};
};

class QuorumState {
 public:
  using Clock = std::chrono::steady_clock;
  struct Message {
    int conn;
    std::string line;
  };

  explicit QuorumState(QuorumConfig config) : config_(config) {}
  int min_replicas() const { return config_.min_replicas; }

  // Events from connection `conn` (any number; a replica is known once it said HELLO).
  // `min_replicas` > 0: the replica's own minimum (fault_tolerance.min_replicas); the job's
  // is the largest of --min-replicas and every replica's.
  void hello(int conn, int id, const std::string& host, int port, Clock::time_point now,
             int min_replicas = 0);
  void heard(int conn, Clock::time_point now);  // any line, a heartbeat included
  void request(int conn, int64_t step, Clock::time_point now);
  void vote(int conn, int64_t quorum_id, int64_t step, bool ok, Clock::time_point now);
  void lost(int conn);               // the connection closed
  void bye(int conn, int64_t step);  // done after `step` steps; leaves (not a failure)

  // Applies the timers (lost heartbeats, quorum formation, stragglers) and returns every
  // message to send since the last call. Connections in closed() should be closed.
  std::vector<Message> advance(Clock::time_point now);
  std::vector<int> take_closed();

  bool stopped() const { return !stop_reason_.empty(); }
  // A replica finished the job (BYE at the last committed step).
  bool finished() const { return finished_; }
  // Finished, and every replica id ever seen left with BYE last: none can be restarting.
  bool all_left() const;
  const std::string& stop_reason() const { return stop_reason_; }
  // One line per event worth a log line (quorums formed, replicas lost, stops).
  std::vector<std::string> take_log();

 private:
  // Replicas are told apart by incarnation (serial): a restarted one, with its id, is not
  // its former self (it holds no state and never joined the former's quorum).
  struct Replica {
    int id = -1;
    uint64_t serial = 0;
    std::string host;
    int port = 0;
    Clock::time_point last_heard;
    bool asking = false;  // sent QUORUM, not yet answered
    int64_t step = 0;
    Clock::time_point asked_at;
  };
  struct Round {  // the commit vote of one step of the current quorum
    int64_t step = -1;
    std::map<uint64_t, bool> votes;  // serial -> ok
    bool decided = false;
    bool outcome = false;
  };

  void drop(int conn, const std::string& why);
  std::string min_name() const;
  void member_gone(uint64_t serial);
  bool alive(uint64_t serial) const;
  bool holder_alive() const;
  void decide(bool commit);
  void try_form(Clock::time_point now);
  void form(const std::vector<int>& conns);
  void decide_votes();
  void stop(const std::string& why);
  void send(int conn, std::string line) { out_.push_back({conn, std::move(line)}); }

  QuorumConfig config_;
  std::map<int, bool> left_;  // replica id -> its latest incarnation said BYE
  int min_from_ = -1;         // the replica whose HELLO raised min_replicas (-1: --min-replicas)
  std::map<int, Replica> replicas_;  // by connection
  std::set<uint64_t> members_;       // serials of the current quorum's replicas
  uint64_t serials_ = 0;
  int64_t quorum_id_ = 0;
  bool formed_once_ = false;
  // A step of the current quorum failed: the next quorum gets a new id even with the same
  // members, so every member rebuilds its group (some may hold a broken one).
  bool renew_ = false;
  int64_t committed_ = 0;  // steps committed so far (a quorum never starts behind them)
  bool finished_ = false;  // a replica finished the job (BYE at the committed step)
  // Replicas that hold the last committed state (its quorum's members, and members that
  // formed a quorum at that step since): while one is alive, the job can heal.
  std::set<uint64_t> holders_;
  Round round_;
  std::vector<Message> out_;
  std::vector<int> closed_;
  std::vector<std::string> log_;
  std::string stop_reason_;
};

}  // namespace lockstep::launch
