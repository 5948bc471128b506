// Internal: init()'s rendezvous through a c10d store: connecting to rank 0's store (or
// hosting it), the handshake (rdzv_auth.h), and the join at which every rank announces
// itself and learns the others'. A timeout lists the ranks that never joined.
#pragma once

#include <lockstep/comm/launch_env.h>
#include <lockstep/comm/process_group.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

namespace lockstep::comm {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// Plain string values in the store.
std::string store_get(const StorePtr& store, const std::string& key);
void store_set(const StorePtr& store, const std::string& key, const std::string& value);

std::string hostname();

// The job's store, handshake done: under mpirun (any backend but mpi) the one whose
// address MPI carries (mpi_bootstrap_store; fills e's master_addr and master_port), else
// rank 0's TCPStore at MASTER_ADDR:MASTER_PORT (a HashStore alone). Groups of one job
// share it: a later call returns the store of an earlier group that is still alive.
StorePtr job_store(LaunchEnv& e, Millis timeout);

// True when the store is bootstrapped through MPI (mpirun, more than one rank, MPI built).
bool bootstraps_through_mpi(const LaunchEnv& e);

// A fresh key namespace per group; groups made in the same order on every rank get the
// same one.
std::string next_prefix();

// Every rank writes `payload` under prefix + "join/<rank>" (sealed with the token's proof
// where there is one), then waits for all: every rank's payload, in rank order. CommError
// (Rendezvous) naming the missing ranks when some do not come within `timeout`.
std::vector<std::string> join(const StorePtr& store, const std::string& prefix, const LaunchEnv& e,
                              Millis timeout, const std::string& payload);

// `pgo` with its own connection to rank 0's store (keys under prefix + "side/") for the
// DETAIL fingerprint check and the stall inspector, where the backend shares no memory
// and either is on. Without it (a warning) when the connection fails.
ProcessGroupOptions with_side_store(ProcessGroupOptions pgo, const std::string& backend,
                                    const LaunchEnv& e, const std::string& prefix);

}  // namespace lockstep::comm
