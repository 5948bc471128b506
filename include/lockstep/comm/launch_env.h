// lockstep/comm/launch_env.h: where this process sits in the job, read from the
// launcher's environment (the names: lockstep/env_contract.h).
#pragma once

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
  // The shared secret of the rendezvous (LOCKSTEP_RDZV_TOKEN, or the first line of the 0600
  // file LOCKSTEP_RDZV_TOKEN_FILE); empty = none. Rank 0 with a token refuses ranks without it.
  std::string rdzv_token;

  bool single_node() const { return local_world_size == world_size; }
  // Reads the process environment; throws ConfigError naming the variable on bad values.
  static LaunchEnv from_environment();
};

}  // namespace lockstep::comm
