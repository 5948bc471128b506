// lockstep/comm/launch_env.h: where this process sits in the job, read from the
// launcher's environment (the names: lockstep/env_contract.h).
#pragma once

#include <string>

namespace lockstep::comm {

// Where this process sits in the job, read from the launcher's environment. The contracts
// (docs/schedulers.md has each one's variables and where they come from):
//   lockstep-run / torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, ...
//   Slurm (srun, a task per rank)  SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID,
//       SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID; master = first host of SLURM_STEP_NODELIST
//   OpenMPI/PMIx (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK, PMI_SIZE, MPI_LOCAL*)
//   PyTorchJob (RANK / WORLD_SIZE per pod, one process per pod), TrainJob (PET_* per pod,
//       one process per pod; several per pod need lockstep-run)
// No environment at all is a world of 1. When two contracts are present (e.g. srun started
// the process, and RANK / WORLD_SIZE were exported by hand) they must agree on rank and
// world size, else from_environment throws a ConfigError naming both.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "none";  // "lockstep-run", "torchrun", "mpirun", "slurm", "pytorchjob",
                                  // "trainjob", "none"
  std::string job_id;             // unique per job where the launcher provides one
  // The shared secret of the rendezvous (LOCKSTEP_RDZV_TOKEN, or the first line of the 0600
  // file LOCKSTEP_RDZV_TOKEN_FILE); empty = none. Rank 0 with a token refuses ranks without it.
  std::string rdzv_token;
  // The contract found, as docs/schedulers.md names it ("Slurm", "OpenMPI/PMIx", ...), and
  // the variables it took, "NAME=value ..." (for describe()).
  std::string contract = "none";
  std::string source;
  // A remark about the environment worth saying even without LOCKSTEP_DEBUG (e.g. a Slurm
  // job with several tasks whose program was started without srun); empty = none.
  std::string note;

  bool single_node() const { return local_world_size == world_size; }
  // Reads the process environment; throws ConfigError naming the variable on bad values,
  // and naming both contracts when two disagree.
  static LaunchEnv from_environment();
  // One line: the contract, the variables taken, and the place in the job they give.
  std::string describe() const;
  // What announce() prints: describe() (and the note) where it is worth it: on rank 0
  // under a scheduler's contract (Slurm, MPI, Kubernetes), on every rank under
  // LOCKSTEP_DEBUG; nothing for lockstep-run / torchrun (lockstep-run says it itself) or no
  // launcher. Lines end in newlines; empty = nothing to say.
  std::string announcement() const;
  // Writes announcement() to stderr, the first time it is called in the process only
  // (init() calls it; a program that makes several groups says it once). Thread-safe.
  void announce() const;
};

}  // namespace lockstep::comm
