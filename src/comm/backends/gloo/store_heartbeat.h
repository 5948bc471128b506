// Internal: StoreHeartbeat, who in a gloo group is alive, learned through the rendezvous
// store (heartbeats and failure notices) and, for same-machine peers, comm's PeerWatch.
//
// Gloo reports a dead peer as a socket error that names an address, not a rank, and a
// stopped peer (or a lost node) not at all until its timeout. This side channel finds
// the rank, within a few seconds, by three means (docs/errors.md, "Failure model"):
//  - same-machine peers are watched by pid (comm/peer_watch.h): an exit is seen at once;
//  - every rank bumps a heartbeat counter in the store every kPeriod; rank 0, which
//    hosts the store, declares a rank whose counter stood still for kStale failed;
//  - whoever finds a failure first publishes it under one store key ("failed"), which
//    every rank polls, so ranks on other nodes learn the culprit too;
//  - an ExternalNotice, when given, is polled the same way: a failure found outside the
//    group (hier: by a rank's peer inside its node, which is in another cross-node group).
// Rank 0's own death closes the store's connections (seen at once); a stopped rank 0
// leaves the others' store calls unanswered, which the watchdog reads after kStale.
// Why the store and not a new channel: it already connects every rank to rank 0, works
// across nodes and without lockstep-run, and costs one small request per rank per
// period (plus P for rank 0): about 30 requests a second at P = 4.
#pragma once

#include "comm/backend_factories.h"
#include "comm/peer_watch.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace lockstep::comm {

struct PeerFailure {
  int peer = -1;            // the failed rank
  std::string what;         // "rank 2 (pid 812, this host) exited"
  bool store_lost = false;  // a closed store connection: rank 0 may just have finished
                            // first, so an op about to complete gets a moment
};

class StoreHeartbeat {
 public:
  static constexpr Millis kPeriod{250};
  static constexpr Millis kStale{3000};

  // Collective over the group: publishes this rank's pid and machine, reads the others'
  // (waiting for them up to the store's timeout), then starts the heartbeat thread.
  StoreHeartbeat(const StorePtr& store, int rank, int size, ExternalNotice notice = {});
  // Says goodbye (a clean leave is no failure) and stops the thread. Never blocks for
  // long: a thread stuck on an unanswering store is left to finish on its own.
  ~StoreHeartbeat();
  StoreHeartbeat(const StoreHeartbeat&) = delete;
  StoreHeartbeat& operator=(const StoreHeartbeat&) = delete;

  // The first failure known, after checking the same-machine peers now; empty if none.
  std::optional<PeerFailure> failure();
  // As failure(), waiting up to `patience` for one to be found (after a transport error:
  // a remote death reaches the store a moment after the socket broke). Never touches the
  // store on the calling thread.
  std::optional<PeerFailure> failure_within(Millis patience);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<PeerFailure> failure;
    PeerWatch local;
    bool stop = false;
    bool done = false;
    Clock::time_point calling_since{};  // the round's store requests began (zero: idle)
    bool acked = false;
    bool poll_now = false;  // failure_within() wants a round at once  // this rank counted itself
                            // under "acked" (it knows the failure)
  };
  static void run(std::shared_ptr<State> st, const StorePtr& store, int rank, int size,
                  int store_host, const ExternalNotice& notice);
  static void record(State& st, PeerFailure f);
  // The job's rank 0 hosts the store: after a failure it keeps it up (bounded) until the others
  // have read the notice, or they would see only the store vanish and blame rank 0.
  void linger_for_acks();

  std::shared_ptr<State> st_;
  StorePtr store_;  // the destructor's linger only (rank 0 asks its own store)
  std::thread thread_;
  int rank_;
  int size_;
  int store_host_ = -1;  // the member that is the job's rank 0 (hosts the store); -1: none
};

}  // namespace lockstep::comm
