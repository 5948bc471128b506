// lockstep/comm/init.h: joining the job's process group from the launch environment.
#pragma once

#include <lockstep/comm/process_group.h>

#include <memory>
#include <optional>
#include <string>

namespace lockstep::comm {

// Where this process sits in the job, read from the launcher's environment:
// torchrun / lockstep-run (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), OpenMPI (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, ...). No environment at all is a world of 1.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "none";  // "torchrun", "mpirun", "slurm", "none"
  std::string job_id;             // unique per job where the launcher provides one

  bool single_node() const { return local_world_size == world_size; }
  // Reads the process environment; throws ConfigError naming the variable on bad values.
  static LaunchEnv from_environment();
};

struct InitOptions {
  // "auto" (mpi under mpirun, shm when all ranks share a node, else gloo), "shm", "gloo", "mpi".
  // LOCKSTEP_BACKEND overrides the default.
  std::string backend = "auto";
  // Default timeout of every op; LOCKSTEP_TIMEOUT_S overrides the default.
  std::optional<Millis> timeout;
  std::optional<bool> check_collectives;  // LOCKSTEP_CHECK_COLLECTIVES=0|1
  std::optional<LaunchEnv> env;           // default: LaunchEnv::from_environment()
};

// Rendezvous with the other ranks and build the group. Throws CommError(Rendezvous)
// naming the missing ranks if some never join within the timeout, and ConfigError
// for a bad environment or an unusable MASTER_PORT.
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});

// The backend `auto` resolves to for this environment.
std::string resolve_backend(const std::string& requested, const LaunchEnv& env);

}  // namespace lockstep::comm

namespace lockstep {
using comm::init;
using comm::InitOptions;
using comm::ProcessGroup;
}  // namespace lockstep
