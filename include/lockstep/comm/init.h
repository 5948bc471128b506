// lockstep/comm/init.h: joining the job's process group from the launch environment.
#pragma once

#include <lockstep/comm/launch_env.h>
#include <lockstep/comm/process_group.h>

#include <memory>
#include <optional>
#include <string>

namespace lockstep::comm {

struct InitOptions {
  // "auto": shm when all ranks share a node; across nodes hier (shm inside each node, gloo
  // between them, mpi under mpirun) when nodes run several ranks, else gloo (mpi under
  // mpirun). Or "shm", "gloo", "hier", "mpi", "nccl". Under mpirun, every backend but mpi
  // rendezvouses through a store whose address MPI carries (no MASTER_PORT needed).
  // LOCKSTEP_BACKEND overrides the default.
  std::string backend = "auto";
  // Default timeout of every op; LOCKSTEP_TIMEOUT_S overrides the default.
  std::optional<Millis> timeout;
  std::optional<bool> check_collectives;  // LOCKSTEP_CHECK_COLLECTIVES=0|1
  std::optional<bool> detail;             // LOCKSTEP_DEBUG=DETAIL (docs/debugging.md)
  std::optional<Millis> stall_warn;       // LOCKSTEP_STALL_WARN_S (0: never warn)
  std::optional<LaunchEnv> env;           // default: LaunchEnv::from_environment()
};

// Rendezvous with the other ranks and build the group. Throws CommError(Rendezvous)
// naming the missing ranks if some never join within the timeout, and ConfigError
// for a bad environment or an unusable MASTER_PORT. Before joining, every rank checks
// that the store is its own job's (LaunchEnv::job_id) and, where rank 0 has a token
// (LaunchEnv::rdzv_token), that it holds the same one: a ConfigError naming both job ids
// otherwise. Single-node stores accept loopback connections only.
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});

// The backend `auto` resolves to for this environment.
// Collective over the whole job (every rank calls it, in the same order relative to other
// init/init_split calls): a new group of the ranks that pass the same `color` (>= 0),
// ordered by their rank in the job. For hierarchical schemes such as FSDP's HYBRID_SHARD:
// init_split(node) for the ranks of one node, init_split(local_rank) for one rank per node.
// Every backend: shm and gloo rendezvous through the job's store; mpi splits
// MPI_COMM_WORLD (MPI_Comm_split, key = world rank) into a communicator of its own.
std::shared_ptr<ProcessGroup> init_split(int color, const InitOptions& options = {});
std::string resolve_backend(const std::string& requested, const LaunchEnv& env);

// HMAC-SHA256 of `message` keyed by `token`, as 64 hex digits: the proof of the rendezvous
// token that ranks write into the store instead of the token (docs/launcher.md,
// "Rendezvous and its security"). Exposed for its tests.
std::string rdzv_proof(const std::string& token, const std::string& message);

}  // namespace lockstep::comm

namespace lockstep {
using comm::init;
using comm::init_split;
using comm::InitOptions;
using comm::ProcessGroup;
}  // namespace lockstep
