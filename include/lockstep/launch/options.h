// lockstep/launch/options.h: the command line of lockstep-run, parsed into a plain struct.
//
// Parsing is a pure function (no I/O, no exit) so it can be unit-tested; main decides what
// a UsageError means for the process (message + exit code 2).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "lockstep/error.h"

namespace lockstep::launch {

// A bad flag or value. The message names the flag and what was expected.
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;         // 0 = pick a free port (single node only)
  bool master_port_given = false;  // --master-port was on the command line
  std::string rdzv_id;             // --rdzv-id; empty = the launcher's default job id
  std::string log_dir;             // empty = no per-rank log files
  int max_restarts = 0;            // whole-group restarts after a failure
  double grace_seconds = 5.0;      // SIGTERM -> SIGKILL grace during teardown
  double notice_seconds = 3.0;     // first failure -> SIGTERM: survivors raise their own error
  bool help = false;               // --help: print usage, run nothing
  // Fault tolerance (docs/fault-tolerance.md): each rank is a replica; a failed one is
  // restarted alone (--max-restarts in all) while the others go on; node 0 hosts the
  // quorum service. --coordinator runs the quorum service alone, no PROGRAM.
  bool fault_tolerant = false;
  bool coordinator = false;
  int min_replicas = 1;  // fewer replicas left: the job stops
  // Ranks per replica (HSDP: one shard group; it must divide --nproc-per-node). Each
  // replica's ranks see RANK/WORLD_SIZE of their own small job and restart together.
  int replica_size = 1;
  int coordinator_port = -1;         // -1: a free port on one node, --master-port + 1 on several
  double heartbeat_timeout = 3.0;    // a replica silent this long is lost
  std::vector<std::string> program;  // PROGRAM and its ARGS; argv[0] first
  // Where a value came from when a flag or a PET_* variable set it: "--nnodes" ->
  // "--nnodes" or "PET_NNODES=2" (docs/schedulers.md). Absent: the default or a scheduler's.
  std::map<std::string, std::string> set_by;
  // The one line saying which scheduler contract gave what (empty: none) and a remark
  // (e.g. a Slurm job but no srun); run_launcher prints both.
  std::string launch_line;
  std::string launch_note;

  int world_size() const { return nnodes * nproc_per_node; }
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
  int replicas() const { return world_size() / replica_size; }
};

// Parses the launcher's arguments (without argv[0]) with CLI11. Options end at the first
// non-option or at "--". Accepts "--flag value" and "--flag=value" ("--flag=" is an empty
// value, never the next argument); torchrun's underscore spellings (--nproc_per_node) are
// accepted as aliases; a repeated flag is checked each time and the last one wins.
// Throws UsageError, naming the flag, on any bad input.
LaunchOptions parse_args(const std::vector<std::string>& args);

// The same over an environment: a scheduler's contract (Slurm under srun, a PyTorchJob
// pod; lockstep/launch/scheduler_env.h) and then PET_NNODES, PET_NPROC_PER_NODE,
// PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ID, PET_MAX_RESTARTS give the
// defaults of the flags (as torchrun reads them); the command line wins, except where it
// contradicts a Slurm step's facts (a UsageError naming both).
LaunchOptions parse_args(const std::vector<std::string>& args,
                         const std::map<std::string, std::string>& env);

// The --help text.
std::string usage_text();

}  // namespace lockstep::launch
