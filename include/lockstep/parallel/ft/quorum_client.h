// lockstep/parallel/ft/quorum_client.h: one replica's connection to the quorum service.
//
// The quorum service (lockstep-run --fault-tolerant on node 0, or lockstep-run
// --coordinator) tells each replica, at every step boundary, who takes part in the step
// (the quorum) and, after the step, whether it commits. A heartbeat thread tells the
// service this replica is alive between requests. Wire format: lockstep/quorum_wire.h;
// rules and timings: docs/fault-tolerance.md. Manager (manager.h) is its user; programs
// rarely need it directly.
#pragma once

#include <lockstep/comm/types.h>
#include <lockstep/error.h>
#include <lockstep/quorum_wire.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::ft {

// The quorum service stopped the job (stopped() true: fewer than --min-replicas replicas
// remain; the message says why), or it cannot be reached (it is the job's one single
// point of failure).
class QuorumError : public Error {
 public:
  QuorumError(const std::string& what, bool stopped) : Error(what), stopped_(stopped) {}
  bool stopped() const { return stopped_; }

 private:
  bool stopped_;
};

class QuorumClient {
 public:
  // Connects to `address` ("HOST:PORT"; retried for up to `connect_timeout`). Throws
  // QuorumError when the service cannot be reached.
  explicit QuorumClient(const std::string& address, comm::Millis heartbeat = comm::Millis(250),
                        comm::Millis connect_timeout = comm::Millis(10000));
  // Closes; the service counts the replica lost unless it said bye() first.
  ~QuorumClient();
  QuorumClient(const QuorumClient&) = delete;
  QuorumClient& operator=(const QuorumClient&) = delete;

  // This end's address of the connection: the address of this host on the network the
  // service is on, where the other replicas can reach this one.
  std::string local_host() const;
  // Says HELLO as replica `replica_id`, whose rendezvous store listens on
  // store_host:store_port, and starts heartbeating every `heartbeat`. Once, first.
  // `min_replicas` > 0 raises the job's minimum (the service stops the job below it).
  void hello(int replica_id, const std::string& store_host, int store_port, int min_replicas = 0);

  // Asks to start step `step` and waits up to `timeout` for the quorum (a joiner waits for
  // the members' next step boundary). Quorum::done when the job finished without it.
  quorum_wire::Quorum quorum(int64_t step, comm::Millis timeout);
  // This replica's vote on `step` of quorum `quorum_id`; returns the service's decision
  // (true: every member of the quorum voted ok).
  bool vote(int64_t quorum_id, int64_t step, bool ok, comm::Millis timeout);

  // The replica finished `step` steps and leaves (done, not lost). Never throws.
  void bye(int64_t step) noexcept;

 private:
  void send_line(const std::string& line);
  // The next line whose first word is one of `words` (STOP throws); skips others.
  std::string await(const std::vector<std::string>& words, comm::Millis timeout);
  [[noreturn]] void lost(const std::string& why) const;
  void beat();

  std::string address_;
  int fd_ = -1;
  std::string pending_;  // bytes read past the last line
  std::mutex write_mu_;
  std::atomic<bool> broken_{false};
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool stopping_ = false;
  comm::Millis heartbeat_;
  std::thread beater_;
};

}  // namespace lockstep::ft
