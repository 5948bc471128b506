// coordinator.h (internal): the quorum service of fault-tolerant jobs, a poll() loop over
// one TCP connection per replica that feeds QuorumState (quorum_state.h). lockstep-run
// --fault-tolerant runs it in a child process of its own on node 0 (never inside a rank,
// whose death would take it along); lockstep-run --coordinator runs it alone.
#pragma once

#include <string>

#include "quorum_state.h"

namespace lockstep::launch {

// Exit code of a service that stopped the job (fewer than --min-replicas replicas).
constexpr int kExitQuorumStop = 3;

// A listening TCP socket on addr:port (port 0: one the kernel picks); *bound gets the port.
// Throws ConfigError naming the port and the fix when it cannot be had.
int listen_on(const std::string& addr, int port, int* bound);

// Serves replicas on `listen_fd` until SIGTERM or SIGINT (returns 0) or until it stops the
// job (tells every replica why, keeps answering STOP for 2 s, returns kExitQuorumStop).
// Logs quorums, losses and the stop on stderr, prefixed "lockstep-run: quorum service: ".
int serve_quorum(int listen_fd, const QuorumConfig& config);

// Whether a TCP connection to the service at "HOST:PORT" can be made, trying for up to
// `within_ms` (a node without the service asks before it restarts a replica).
bool service_reachable(const std::string& address, int within_ms);

}  // namespace lockstep::launch
