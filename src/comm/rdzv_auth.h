// Internal: the rendezvous store's authentication (docs/launcher.md, "Rendezvous and its
// security"). The token never enters the store, which any process that reaches the port
// can read: ranks write HMAC-SHA256 proofs of it (rdzv_proof, init.h), keyed by a nonce
// fresh per store so that proofs cannot be replayed.
#pragma once

#include <lockstep/comm/launch_env.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

namespace lockstep::comm {

// The first exchange on a fresh store, before any rank announces itself: rank 0 publishes
// a nonce, its job id and whether a token is required; every other rank checks both, and
// a token's proof. A ConfigError naming the cause and the fix otherwise.
void handshake(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnv& e);

// With a token, a join entry carries an HMAC of (nonce, job, key, payload) after its
// payload: entries written by a process without the token are told apart from the job's
// own. Without a token (or alone) the payload as it is.
std::string seal(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnv& e,
                 const std::string& key, const std::string& payload);
// The payload of `entry`, the join entry of rank `rank` under `key`; CommError
// (Rendezvous) naming the rank when its proof is missing or wrong.
std::string unseal(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnv& e,
                   const std::string& key, const std::string& entry, int rank);

}  // namespace lockstep::comm
