// lockstep/env_contract.h: the names of the launch environment, written once.
//
// The launcher (lockstep-run, src/launch/rank_env.cpp) writes these variables into every
// rank's environment and the communication layer (LaunchEnv::from_environment,
// src/comm/launch_env.cpp; init(), src/comm/init.cpp) reads them back. Both spell a
// name through this header only, so writer and reader cannot drift apart. Values and
// semantics: docs/launcher.md ("Environment of each rank").
//
// Base layer: no dependencies, includable from every layer (scripts/layers.py).
#pragma once

namespace lockstep::env {

// --- torchrun's contract (also what torch.distributed reads) --------------------------
inline constexpr const char* kRank = "RANK";                        // global rank
inline constexpr const char* kWorldSize = "WORLD_SIZE";             // ranks in the job
inline constexpr const char* kLocalRank = "LOCAL_RANK";             // rank on this node
inline constexpr const char* kLocalWorldSize = "LOCAL_WORLD_SIZE";  // ranks on this node
inline constexpr const char* kGroupRank = "GROUP_RANK";             // node index
inline constexpr const char* kGroupWorldSize = "GROUP_WORLD_SIZE";  // number of nodes
inline constexpr const char* kRoleRank = "ROLE_RANK";               // = RANK (one role)
inline constexpr const char* kRoleWorldSize = "ROLE_WORLD_SIZE";    // = WORLD_SIZE
inline constexpr const char* kMasterAddr = "MASTER_ADDR";           // rank 0's store host
inline constexpr const char* kMasterPort = "MASTER_PORT";           // its port (never 0)
inline constexpr const char* kTorchelasticRunId = "TORCHELASTIC_RUN_ID";
inline constexpr const char* kTorchelasticRestartCount = "TORCHELASTIC_RESTART_COUNT";
inline constexpr const char* kTorchelasticMaxRestarts = "TORCHELASTIC_MAX_RESTARTS";

// --- lockstep-run's own additions -------------------------------------------------------
inline constexpr const char* kLauncher = "LOCKSTEP_LAUNCHER";  // "lockstep-run"
inline constexpr const char* kLauncherName = "lockstep-run";   // its value
inline constexpr const char* kJobId = "LOCKSTEP_JOB_ID";       // same for all ranks and restarts
// The rendezvous token a multi-node job may require (docs/launcher.md, "Rendezvous and its
// security"): the token itself, or a file holding it that only its owner can read (0600).
inline constexpr const char* kRdzvToken = "LOCKSTEP_RDZV_TOKEN";
inline constexpr const char* kRdzvTokenFile = "LOCKSTEP_RDZV_TOKEN_FILE";
inline constexpr const char* kRestartCount = "LOCKSTEP_RESTART_COUNT";  // 0, 1, 2, ...
inline constexpr const char* kMaxRestarts = "LOCKSTEP_MAX_RESTARTS";    // --max-restarts
// Fault-tolerant jobs (--fault-tolerant, docs/fault-tolerance.md): the quorum service's
// HOST:PORT, this replica's id (global rank / --replica-size under lockstep-run), its
// number of ranks (--replica-size, HSDP) and the number of replicas launched.
inline constexpr const char* kCoordinator = "LOCKSTEP_COORDINATOR";
inline constexpr const char* kReplicaId = "LOCKSTEP_REPLICA_ID";
inline constexpr const char* kReplicaSize = "LOCKSTEP_REPLICA_SIZE";  // ranks per replica
inline constexpr const char* kReplicas = "LOCKSTEP_REPLICAS";         // replicas launched
// Where a failing rank writes its exception's message (lockstep/launch/error_file.h); the
// same path also under torchelastic's name, which torch's @record writes (JSON).
inline constexpr const char* kErrorFile = "LOCKSTEP_ERROR_FILE";
inline constexpr const char* kTorchelasticErrorFile = "TORCHELASTIC_ERROR_FILE";

// --- settings of init() that a user (or a test) may set ---------------------------------
inline constexpr const char* kBackend = "LOCKSTEP_BACKEND";           // auto | shm | gloo | mpi
inline constexpr const char* kTimeoutSeconds = "LOCKSTEP_TIMEOUT_S";  // default op timeout
inline constexpr const char* kCheckCollectives = "LOCKSTEP_CHECK_COLLECTIVES";  // 0 | 1
// Fault injection for tests of the trainer's non-finite guard: "STEP:RANK" makes rank RANK's
// loss and first gradient NaN at optimizer step STEP (1-based).
inline constexpr const char* kFaultNonFinite = "LOCKSTEP_FAULT_NONFINITE";
// "0": gloo/mpi ignore which ranks share this machine (no pid watching), as if each ran on
// its own node, so one host can test the cross-node failure detection (heartbeats).
inline constexpr const char* kLivenessLocal = "LOCKSTEP_LIVENESS_LOCAL";
// Errors that wrap libtorch's (e.g. an unloadable checkpoint file) print its full stack
// trace only when this is set to anything but "" or "0". The value DETAIL also compares
// every collective's fingerprint across ranks on every backend (docs/debugging.md).
inline constexpr const char* kDebug = "LOCKSTEP_DEBUG";
inline constexpr const char* kDebugDetail = "DETAIL";  // kDebug's value (any case)
// Seconds an op may wait before rank 0 reports the ranks that have not entered it, and
// what each last entered (0: never; default 60). docs/debugging.md.
inline constexpr const char* kStallWarnSeconds = "LOCKSTEP_STALL_WARN_S";

// --- other launchers, read (never written) by LaunchEnv::from_environment ---------------
// OpenMPI's mpirun.
inline constexpr const char* kOmpiRank = "OMPI_COMM_WORLD_RANK";
inline constexpr const char* kOmpiSize = "OMPI_COMM_WORLD_SIZE";
inline constexpr const char* kOmpiLocalRank = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr const char* kOmpiLocalSize = "OMPI_COMM_WORLD_LOCAL_SIZE";
// MPICH / Intel MPI (PMI).
inline constexpr const char* kPmiRank = "PMI_RANK";
inline constexpr const char* kPmiSize = "PMI_SIZE";
inline constexpr const char* kMpiLocalRankId = "MPI_LOCALRANKID";
inline constexpr const char* kMpiLocalNRanks = "MPI_LOCALNRANKS";
// PMIx (OpenMPI 5's prterun, srun --mpi=pmix): the rank only; the size comes from PMIx.
inline constexpr const char* kPmixRank = "PMIX_RANK";
// Slurm's srun (docs/schedulers.md). The SLURM_STEP_* names are set by srun for the tasks
// of a step only, never in a batch script: their presence says "started by srun".
inline constexpr const char* kSlurmProcId = "SLURM_PROCID";    // task index in the step
inline constexpr const char* kSlurmNTasks = "SLURM_NTASKS";    // tasks of the step
inline constexpr const char* kSlurmLocalId = "SLURM_LOCALID";  // task index on this node
inline constexpr const char* kSlurmNodeId = "SLURM_NODEID";    // node index in the step
inline constexpr const char* kSlurmNTasksPerNode = "SLURM_NTASKS_PER_NODE";  // --ntasks-per-node
inline constexpr const char* kSlurmNNodes = "SLURM_NNODES";
inline constexpr const char* kSlurmJobId = "SLURM_JOB_ID";
inline constexpr const char* kSlurmJobNodeList = "SLURM_JOB_NODELIST";  // hostlist syntax
inline constexpr const char* kSlurmJobNumNodes = "SLURM_JOB_NUM_NODES";
inline constexpr const char* kSlurmStepId = "SLURM_STEP_ID";
inline constexpr const char* kSlurmStepNodeList = "SLURM_STEP_NODELIST";  // hostlist syntax
inline constexpr const char* kSlurmStepNumNodes = "SLURM_STEP_NUM_NODES";
inline constexpr const char* kSlurmStepNumTasks = "SLURM_STEP_NUM_TASKS";
inline constexpr const char* kSlurmStepTasksPerNode = "SLURM_STEP_TASKS_PER_NODE";  // "2(x3),1"
// Kubernetes: Kubeflow's PyTorchJob (training-operator, v1) sets RANK / WORLD_SIZE per pod
// (RANK = the pod's index) with MASTER_ADDR / MASTER_PORT, and torchrun's flag defaults
// PET_*; Trainer v2's TrainJob sets only PET_*. lockstep-run reads PET_* as the defaults of
// its flags, as torchrun does. Sources: docs/schedulers.md.
inline constexpr const char* kPetNNodes = "PET_NNODES";
inline constexpr const char* kPetNProcPerNode = "PET_NPROC_PER_NODE";
inline constexpr const char* kPetNodeRank = "PET_NODE_RANK";
inline constexpr const char* kPetMasterAddr = "PET_MASTER_ADDR";
inline constexpr const char* kPetMasterPort = "PET_MASTER_PORT";
inline constexpr const char* kPetRdzvId = "PET_RDZV_ID";
inline constexpr const char* kPetMaxRestarts = "PET_MAX_RESTARTS";
inline constexpr const char* kKubernetesServiceHost = "KUBERNETES_SERVICE_HOST";  // in every pod

// The rendezvous port of a Slurm step when none is given: derived from "JOB.STEP" (FNV-1a),
// so every task and node computes the same one and concurrent steps on a node differ. The
// range 29500..32499 stays below Linux's ephemeral ports (32768..60999 by default): a port
// there can be held by any outgoing connection on the node, which made bind fail at random.
inline int slurm_port(const char* job_step) {
  unsigned long h = 2166136261UL;
  for (const char* c = job_step; *c; ++c)
    h = ((h ^ static_cast<unsigned char>(*c)) * 16777619UL) & 0xffffffffUL;
  return 29500 + static_cast<int>(h % 3000UL);
}

}  // namespace lockstep::env
