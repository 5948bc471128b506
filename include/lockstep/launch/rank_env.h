// lockstep/launch/rank_env.h: the environment each rank starts with (torchrun's contract).
//
// Pure functions over maps so the contract is unit-testable without spawning anything.
// The variables' names live in lockstep/env_contract.h, shared with their reader,
// comm::LaunchEnv::from_environment.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/blas_core.h"
#include "lockstep/launch/options.h"

namespace lockstep::launch {

using EnvMap = std::map<std::string, std::string>;

// What is shared by all ranks of one start of the group.
struct GroupContext {
  std::string job_id;     // LOCKSTEP_JOB_ID: unique per launch, same for every restart
  int master_port = 0;    // the resolved port (never 0 here)
  int restart_count = 0;  // 0 on the first start, then 1, 2, ...
  // Fault-tolerant jobs: the quorum service's HOST:PORT (empty: not fault tolerant) and,
  // on node 0, the pid of the process that serves it (-1 elsewhere).
  std::string coordinator;
  int service_pid = -1;
};

// The launcher's own environment as a map (from `environ`).
EnvMap current_environment();

// base + the rank's contract: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// ROLE_RANK, MASTER_ADDR, MASTER_PORT, LOCKSTEP_*/TORCHELASTIC_* restart counters, and
// OMP_NUM_THREADS=1 unless base already has it (P ranks each spawning one OpenMP thread
// per core would oversubscribe the machine P times), and malloc_defaults(base).
EnvMap rank_env(const LaunchOptions& opt, int local_rank, const GroupContext& group,
                const EnvMap& base);

// --fault-tolerant --replica-size S > 1: turns `env` (rank_env's) into that of rank
// local_rank % S of its replica's own job of S ranks: RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, MASTER_ADDR 127.0.0.1 (a replica runs on one node), MASTER_PORT
// `replica_port`, and a job id of its own per incarnation (`restarts`), so a rank of a
// replica's earlier life is refused by the new one's store. LOCKSTEP_REPLICA_ID stays the
// replica's number, global_rank / S.
void make_replica_env(const LaunchOptions& opt, int local_rank, int replica_port, int restarts,
                      EnvMap& env);

// glibc malloc settings for training processes, each only where base does not set it
// (and none where GLIBC_TUNABLES tunes malloc): MALLOC_MMAP_MAX_=0 (not with a
// MALLOC_MMAP_THRESHOLD_ of the user's) and a 16 GiB
// MALLOC_TRIM_THRESHOLD_, so large tensors freed and allocated again every step reuse
// heap pages instead of page-faulting through fresh mmap()s. The process keeps its peak
// heap until it exits.
EnvMap malloc_defaults(const EnvMap& base);

// What lockstep-run adds for OpenBLAS (lockstep/blas_core.h): OPENBLAS_CORETYPE when the
// OpenBLAS the ranks load picks kernels below the CPU's tier and base does not set
// OPENBLAS_CORETYPE (a user's value always stands), with the one line the launcher says
// about it; empty otherwise (the pick is right, the BLAS is not OpenBLAS, not x86-64).
struct BlasTuning {
  EnvMap env;
  std::string note;
};
BlasTuning blas_tuning(const EnvMap& base, std::string_view detected_core, blas::Isa cpu, bool amd);
// The same for this machine: probes the core OpenBLAS picks here (probe_openblas_core)
// unless base sets OPENBLAS_CORETYPE.
BlasTuning blas_tuning(const EnvMap& base);

// The core OpenBLAS picks on its own on this machine (openblas_get_corename() of the
// libblas.so.3 a libtorch program loads, else libopenblas.so.0), looked up in a child
// process; "" when neither is OpenBLAS or the probe fails.
std::string probe_openblas_core();

// True when the launcher should print its OMP_NUM_THREADS note (as torchrun does).
bool should_note_omp(const LaunchOptions& opt, const EnvMap& base);

// "NAME=value" strings for execve.
std::vector<std::string> to_envp(const EnvMap& env);

// hostname-pid-starttime-random: unique per launch, and a legal shm name component.
std::string make_job_id();

}  // namespace lockstep::launch
