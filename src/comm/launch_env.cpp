// Reading the launcher's environment: lockstep-run / torchrun, Slurm, OpenMPI, MPICH,
// PyTorchJob, TrainJob, and the check that two present contracts agree (the names:
// lockstep/env_contract.h, shared with the writer, src/launch/rank_env.cpp; each contract:
// docs/schedulers.md).
#include <lockstep/comm/launch_env.h>
#include <lockstep/env_contract.h>
#include <lockstep/error.h>
#include <lockstep/hostlist.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <mutex>

namespace lockstep::comm {
namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int parse_int(const char* name, const char* value) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < 0 || v > (1L << 30))
    throw ConfigError(lockstep::detail::concat("environment variable ", name, "='", value,
                                               "' is not a non-negative integer"));
  return static_cast<int>(v);
}

int int_or(const char* name, int fallback) {
  const char* v = get(name);
  return v ? parse_int(name, v) : fallback;
}

// The variables of one launcher, by role.
struct Contract {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

void check_consistent(const LaunchEnv& e, const Contract& c) {
  if (e.world_size < 1)
    throw ConfigError(
        lockstep::detail::concat(c.size, "=", e.world_size, ": the world needs at least 1 rank"));
  if (e.rank >= e.world_size)
    throw ConfigError(
        lockstep::detail::concat(c.rank, "=", e.rank, " is not below ", c.size, "=", e.world_size));
  if (e.local_world_size < 1 || e.local_world_size > e.world_size)
    throw ConfigError(lockstep::detail::concat(c.local_size, "=", e.local_world_size,
                                               " must be in 1..", c.size, "=", e.world_size));
  if (e.local_rank >= e.local_world_size)
    throw ConfigError(lockstep::detail::concat(c.local_rank, "=", e.local_rank, " is not below ",
                                               c.local_size, "=", e.local_world_size));
}

// "NAME=value" for each set variable among names, space separated.
std::string taken(std::initializer_list<const char*> names) {
  std::string out;
  for (const char* n : names)
    if (const char* v = get(n)) out += lockstep::detail::concat(out.empty() ? "" : " ", n, "=", v);
  return out;
}

LaunchEnv read(const Contract& c) {
  LaunchEnv e;
  e.launcher = c.launcher;
  e.rank = parse_int(c.rank, get(c.rank));
  if (!get(c.size))
    throw ConfigError(
        lockstep::detail::concat(c.rank, " is set but ", c.size,
                                 " is not: a launcher sets both (or neither, for one process)"));
  e.world_size = parse_int(c.size, get(c.size));
  // Without local information, assume every rank shares this node (a hand-made launch).
  e.local_rank = int_or(c.local_rank, e.rank);
  e.local_world_size = int_or(c.local_size, e.world_size);
  check_consistent(e, c);
  e.source = taken({c.rank, c.size, c.local_rank, c.local_size});
  return e;
}

// --- which contracts are present ----------------------------------------------------------

namespace n = lockstep::env;

// RANK written by a per-node launcher (lockstep-run, torchrun): its GROUP_* or own names.
bool per_node_launcher() {
  return get(n::kLauncher) || get(n::kGroupRank) || get(n::kTorchelasticRunId);
}
// RANK / WORLD_SIZE in a pod without a launcher: Kubeflow's PyTorchJob (RANK = the pod).
bool in_kubernetes() { return get(n::kKubernetesServiceHost) || get(n::kPetNNodes); }
// srun's step variables: absent in a batch script and in salloc's shell.
bool in_slurm_step() { return get(n::kSlurmProcId) && get(n::kSlurmStepNumTasks); }

// The master address of a Slurm step: the first host of the step's nodes (task 0 runs
// there in Slurm's block layout), else of the job's.
std::string slurm_master(std::string& source) {
  const char* list = get(n::kSlurmStepNodeList) ? n::kSlurmStepNodeList : n::kSlurmJobNodeList;
  if (!get(list)) return "127.0.0.1";
  source += lockstep::detail::concat(" ", list, "=", get(list));
  return hostlist::first(get(list));
}

// The tasks on this node: SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID, else
// --ntasks-per-node, else an even share.
int slurm_local_size(const LaunchEnv& e, std::string& source) {
  const char* per_node = get(n::kSlurmStepTasksPerNode);
  if (per_node && get(n::kSlurmNodeId)) {
    source += lockstep::detail::concat(" ", n::kSlurmStepTasksPerNode, "=", per_node, " ",
                                       n::kSlurmNodeId, "=", get(n::kSlurmNodeId));
    return hostlist::tasks_on_node(per_node, parse_int(n::kSlurmNodeId, get(n::kSlurmNodeId)));
  }
  if (get(n::kSlurmNTasksPerNode)) return int_or(n::kSlurmNTasksPerNode, 1);
  const int nodes = int_or(n::kSlurmStepNumNodes, int_or(n::kSlurmNNodes, 1));
  return std::max(1, e.world_size / std::max(1, nodes));
}

LaunchEnv read_slurm() {
  LaunchEnv e = read(
      {"slurm", n::kSlurmProcId, n::kSlurmStepNumTasks, n::kSlurmLocalId, n::kSlurmNTasksPerNode});
  e.contract = "Slurm";
  e.local_world_size = slurm_local_size(e, e.source);
  check_consistent(e, {"slurm", n::kSlurmProcId, n::kSlurmStepNumTasks, n::kSlurmLocalId,
                       n::kSlurmStepTasksPerNode});
  e.master_addr = slurm_master(e.source);
  if (const char* job = get(n::kSlurmJobId)) {
    const std::string step =
        lockstep::detail::concat(job, ".", get(n::kSlurmStepId) ? get(n::kSlurmStepId) : "0");
    e.source += lockstep::detail::concat(" ", n::kSlurmJobId, "=", job);
    if (get(n::kSlurmStepId))
      e.source += lockstep::detail::concat(" ", n::kSlurmStepId, "=", get(n::kSlurmStepId));
    e.job_id = "slurm-" + step;
    // A port derived from job and step, so concurrent steps on a node do not collide.
    e.master_port = n::slurm_port(step.c_str());
  }
  return e;
}

// PyTorchJob's per-pod RANK / WORLD_SIZE with one process per pod.
LaunchEnv read_pytorchjob() {
  LaunchEnv e = read({"pytorchjob", n::kRank, n::kWorldSize, n::kLocalRank, n::kLocalWorldSize});
  e.contract = "PyTorchJob";
  const char* nproc = get(n::kPetNProcPerNode);
  if (nproc && std::string(nproc) != "1")
    throw ConfigError(lockstep::detail::concat(
        "PyTorchJob runs ", n::kPetNProcPerNode, "=", nproc, " processes per pod (", n::kRank, "=",
        get(n::kRank),
        " is the pod's index, not a process's): start them with lockstep-run in "
        "the pod (command: lockstep-run PROGRAM ...), or set nprocPerNode to 1"));
  if (!get(n::kLocalRank)) e.local_rank = 0, e.local_world_size = 1;  // one process per pod
  e.source += " " + taken({n::kPetNNodes, n::kPetNodeRank, n::kPetNProcPerNode});
  return e;
}

// TrainJob's PET_* with a program started directly in each pod (one process per pod).
LaunchEnv read_trainjob() {
  LaunchEnv e;
  e.launcher = "trainjob";
  e.contract = "TrainJob";
  const char* nproc = get(n::kPetNProcPerNode);
  if (nproc && std::string(nproc) != "1")
    throw ConfigError(lockstep::detail::concat(
        "TrainJob runs ", n::kPetNProcPerNode, "=", nproc,
        " processes per node: start them with lockstep-run in the pod (command: lockstep-run "
        "PROGRAM ...; it reads PET_*), or set numProcPerNode to 1"));
  if (!get(n::kPetNodeRank))
    throw ConfigError(lockstep::detail::concat(n::kPetNNodes, " is set but ", n::kPetNodeRank,
                                               " is not: this pod does not know its index"));
  e.rank = parse_int(n::kPetNodeRank, get(n::kPetNodeRank));
  e.world_size = parse_int(n::kPetNNodes, get(n::kPetNNodes));
  check_consistent(e, {"trainjob", n::kPetNodeRank, n::kPetNNodes, "-", "-"});
  if (const char* a = get(n::kPetMasterAddr)) e.master_addr = a;
  if (const char* p = get(n::kPetMasterPort)) e.master_port = parse_int(n::kPetMasterPort, p);
  e.source = taken(
      {n::kPetNNodes, n::kPetNodeRank, n::kPetNProcPerNode, n::kPetMasterAddr, n::kPetMasterPort});
  return e;
}

// The contract that started this process, by precedence: a per-node launcher's rank
// variables, then hand-made (or PyTorchJob) RANK, MPI, a Slurm step, TrainJob.
LaunchEnv read_primary() {
  LaunchEnv e;
  if (get(n::kRank) && !per_node_launcher() && in_kubernetes()) return read_pytorchjob();
  if (get(n::kRank)) {
    e = read({"torchrun", n::kRank, n::kWorldSize, n::kLocalRank, n::kLocalWorldSize});
    e.contract = "torchrun";
    if (const char* l = get(n::kLauncher)) e.launcher = e.contract = l;
  } else if (get(n::kOmpiRank)) {
    e = read({"mpirun", n::kOmpiRank, n::kOmpiSize, n::kOmpiLocalRank, n::kOmpiLocalSize});
    e.contract = "OpenMPI/PMIx";
  } else if (get(n::kPmiRank)) {
    e = read({"mpirun", n::kPmiRank, n::kPmiSize, n::kMpiLocalRankId, n::kMpiLocalNRanks});
    e.contract = "MPICH/PMI";
  } else if (in_slurm_step()) {
    e = read_slurm();
  } else if (get(n::kPetNNodes)) {
    e = read_trainjob();
  }
  return e;
}

// --- conflicts ------------------------------------------------------------------------------

[[noreturn]] void conflict(const LaunchEnv& a, const std::string& b_name, const std::string& b_says,
                           const std::string& b_vars, const std::string& fix) {
  throw ConfigError(lockstep::detail::concat("conflicting launch environments: ", a.contract,
                                             " says rank ", a.rank, " of ", a.world_size, " (",
                                             a.source, ") but ", b_name, " says ", b_says, " (",
                                             b_vars, "). ", fix, " (docs/schedulers.md)"));
}

// A Slurm step around a process whose rank came from elsewhere. Under a per-node launcher
// the step's tasks are the launchers: one per node, GROUP_RANK = SLURM_PROCID. Under MPI the
// step may be mpirun's daemons (one per node): compared only when it has as many tasks as
// the MPI world. Hand-made RANK / WORLD_SIZE must match the task they run in.
void check_against_slurm(const LaunchEnv& e) {
  if (!in_slurm_step() || e.contract == "Slurm") return;
  const int tasks = parse_int(n::kSlurmStepNumTasks, get(n::kSlurmStepNumTasks));
  const int task = parse_int(n::kSlurmProcId, get(n::kSlurmProcId));
  const std::string vars = taken({n::kSlurmProcId, n::kSlurmStepNumTasks});
  if (per_node_launcher()) {
    if (!get(n::kGroupWorldSize)) return;
    const int nodes = parse_int(n::kGroupWorldSize, get(n::kGroupWorldSize));
    const int node = int_or(n::kGroupRank, 0);
    if (nodes != tasks || node != task)
      conflict(e, "Slurm", lockstep::detail::concat("its launcher is task ", task, " of ", tasks),
               vars + " " + taken({n::kGroupRank, n::kGroupWorldSize}),
               lockstep::detail::concat("srun started ", tasks,
                                        " launchers but each formed a job of ", nodes,
                                        " node(s): drop --nnodes/--node-rank so lockstep-run reads "
                                        "them from Slurm (torchrun: --nnodes $SLURM_NNODES "
                                        "--node-rank $SLURM_NODEID)"));
    return;
  }
  if (e.launcher == "mpirun" && tasks != e.world_size) return;  // mpirun's daemons
  if (task != e.rank || tasks != e.world_size)
    conflict(e, "Slurm", lockstep::detail::concat("rank ", task, " of ", tasks), vars,
             "Start the ranks one way: unset the other's variables (e.g. RANK / WORLD_SIZE "
             "exported in the batch script) or leave srun out");
}

// Hand-made RANK / WORLD_SIZE beside MPI's variables (mpirun -x RANK=...).
void check_against_mpi(const LaunchEnv& e) {
  if (e.launcher == "mpirun" || per_node_launcher() || !get(n::kRank)) return;
  const char* rank = get(n::kOmpiRank) ? n::kOmpiRank : get(n::kPmiRank) ? n::kPmiRank : nullptr;
  if (!rank) return;
  const char* size = rank == n::kOmpiRank ? n::kOmpiSize : n::kPmiSize;
  const int r = parse_int(rank, get(rank));
  const int s = int_or(size, -1);
  if (r != e.rank || s != e.world_size)
    conflict(e, rank == n::kOmpiRank ? "OpenMPI/PMIx" : "MPICH/PMI",
             lockstep::detail::concat("rank ", r, " of ", s), taken({rank, size}),
             "Start the ranks one way: unset RANK / WORLD_SIZE under mpirun, or leave mpirun out");
}

// A Slurm allocation (batch script, salloc) whose program was started without srun.
std::string slurm_note(const LaunchEnv& e) {
  if (e.contract != "none" || in_slurm_step() || !get(n::kSlurmJobId)) return "";
  const int tasks = int_or(n::kSlurmNTasks, 1);
  const int nodes = int_or(n::kSlurmJobNumNodes, int_or(n::kSlurmNNodes, 1));
  if (tasks <= 1 && nodes <= 1) return "";
  return lockstep::detail::concat("lockstep: inside Slurm job ", get(n::kSlurmJobId), " (", tasks,
                                  " tasks on ", nodes,
                                  " nodes) but not started by srun: running as 1 "
                                  "process; start the ranks with srun (docs/schedulers.md)");
}

// The token file must be a regular file that only its owner can read or write: a token
// others can read protects nothing.
std::string read_token_file(const char* path) {
  namespace n = lockstep::env;
  struct stat st {};
  if (stat(path, &st) != 0)
    throw ConfigError(lockstep::detail::concat(n::kRdzvTokenFile, "='", path,
                                               "' cannot be read: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0 || st.st_uid != geteuid())
    throw ConfigError(
        lockstep::detail::concat(n::kRdzvTokenFile, "='", path,
                                 "' must be a regular file of yours that only you can read "
                                 "(chmod 600 ",
                                 path, ")"));
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  if (token.empty())
    throw ConfigError(lockstep::detail::concat(n::kRdzvTokenFile, "='", path,
                                               "' is empty: its first line is the token"));
  return token;
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv e = read_primary();
  check_against_slurm(e);
  check_against_mpi(e);
  e.note = slurm_note(e);
  if (const char* a = get(n::kMasterAddr)) e.master_addr = a;
  if (const char* p = get(n::kMasterPort)) {
    e.master_port = parse_int(n::kMasterPort, p);
    if (e.master_port < 1 || e.master_port > 65535)
      throw ConfigError(
          lockstep::detail::concat(n::kMasterPort, "=", p, " is not a TCP port (1..65535)"));
  }
  if (e.contract != "none" && e.contract != "Slurm" && e.contract != "TrainJob")
    e.source += " " + taken({n::kMasterAddr, n::kMasterPort});
  if (const char* j = get(n::kJobId)) e.job_id = j;
  if (const char* t = get(n::kRdzvToken)) e.rdzv_token = t;
  if (const char* f = get(n::kRdzvTokenFile)) {
    if (!e.rdzv_token.empty())
      throw ConfigError(lockstep::detail::concat("both ", n::kRdzvToken, " and ", n::kRdzvTokenFile,
                                                 " are set: set only one"));
    e.rdzv_token = read_token_file(f);
  }
  return e;
}

std::string LaunchEnv::describe() const {
  if (contract == "none") return "lockstep: no launcher's environment: 1 process";
  // Under mpirun the store's address travels over MPI (init(); docs/mpi.md).
  const bool via_mpi = launcher == "mpirun" && world_size > 1;
  return lockstep::detail::concat(
      "lockstep: launched by ", contract, " (", source, "): rank ", rank, " of ", world_size,
      ", local rank ", local_rank, " of ", local_world_size,
      via_mpi ? std::string(", store address from MPI")
              : lockstep::detail::concat(", master ", master_addr, ":", master_port),
      job_id.empty() ? std::string() : ", job " + job_id);
}

std::string LaunchEnv::announcement() const {
  const char* debug = get(n::kDebug);
  const bool all = debug && std::string(debug) != "0";
  const bool scheduler =
      contract != "none" && contract != "torchrun" && contract != n::kLauncherName;
  std::string out;
  if (all || (rank == 0 && scheduler)) out += describe() + "\n";
  if (!note.empty()) out += note + "\n";
  return out;
}

void LaunchEnv::announce() const {
  // Once per process: a program that calls init() for several groups says it once.
  static std::once_flag once;
  std::call_once(once, [this] {
    const std::string out = announcement();
    if (!out.empty()) (void)!write(2, out.data(), out.size());
  });
}

}  // namespace lockstep::comm
