// Internal: which backend a group gets, and building it. resolve_backend (init.h) turns
// "auto" into a name from the launch environment alone; for hier the job's layout, as
// every rank told it at the join, decides between hier and a flat transport (the same
// choice on every rank: it depends only on what the join gathered).
#pragma once

#include <lockstep/comm/init.h>
#include <lockstep/comm/launch_env.h>
#include <lockstep/comm/process_group.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>
#include <vector>

namespace lockstep::comm {

// What each rank says of itself at the join: where it sits on its node, and the node.
std::string join_payload(const LaunchEnv& e);

struct Joined {
  std::vector<int> local_ranks, local_sizes;
  std::vector<std::string> hosts;
};
// Every rank's join_payload(), parsed.
Joined parse_joined(const std::vector<std::string>& payloads);

// The group of `backend` ("shm", "gloo" or "nccl") over the ranks in `e` (hosts: each
// one's hostname; shm needs them all equal), rendezvousing under `prefix` in `store`,
// which the group keeps alive.
std::shared_ptr<ProcessGroup> store_group(const std::string& backend,
                                          const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::string& prefix, const LaunchEnv& e,
                                          const std::vector<std::string>& hosts,
                                          const ProcessGroupOptions& pgo);

// The hier group if the job's layout allows it, crossing nodes with mpi under mpirun and
// gloo otherwise. Where the layout does not allow it, or one rank per node makes it
// pointless, a job that asked for "auto" gets that flat transport; one that asked for
// "hier" by name (`requested`) gets a ConfigError with the reason.
std::shared_ptr<ProcessGroup> hier_group(const c10::intrusive_ptr<c10d::Store>& store,
                                         const std::string& prefix, const LaunchEnv& e,
                                         const Joined& joined, bool requested,
                                         const ProcessGroupOptions& pgo);

}  // namespace lockstep::comm
