// lockstep/comm/make_group.h: a process group over a c10d store that the caller's ranks
// already share (torch.distributed's per-group store, or a TCPStore of the program's
// own), for programs that do their own rendezvous; init() makes its own store instead.
#pragma once

#include <lockstep/comm/init.h>
#include <lockstep/comm/process_group.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

namespace lockstep::comm {

// Collective over the ranks of options.env (default: LaunchEnv::from_environment();
// rank, world_size, local_rank and local_world_size are used): each builds the group
// of options.backend, rendezvousing through `store` under `key_prefix`, which must be the
// same on every rank and fresh for each group. The group keeps `store` alive.
//  - backend: "shm" (every rank on this node: local_world_size == world_size), "gloo",
//    "hier" or "nccl"; "auto" reads LOCKSTEP_BACKEND, else shm on one node and gloo
//    otherwise. hier (shm inside each node, gloo across) needs local_rank and
//    local_world_size to be the ranks' places on their nodes, the same number on every
//    node, numbered node by node; where they are not, it is gloo across all (rank 0 says
//    why). mpi needs init()'s own rendezvous: a ConfigError says so.
//  - timeout, check_collectives, detail, stall_warn: as init(), from InitOptions if set,
//    else from LOCKSTEP_TIMEOUT_S, LOCKSTEP_CHECK_COLLECTIVES, LOCKSTEP_DEBUG and
//    LOCKSTEP_STALL_WARN_S, else the defaults (docs/debugging.md).
// Unlike init(), no job id or token handshake (the store is the caller's) and no stall
// inspector questions across ranks on gloo (it shows this rank's own waits only).
std::shared_ptr<ProcessGroup> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                         const InitOptions& options,
                                         const std::string& key_prefix = "lockstep/");

}  // namespace lockstep::comm
