// lockstep/launch/options.h: the command line of lockstep-run, parsed into a plain struct.
//
// Parsing is a pure function (no I/O, no exit) so it can be unit-tested; main decides what
// a UsageError means for the process (message + exit code 2).
#pragma once

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
  int master_port = 29500;           // 0 = pick a free port (single node only)
  bool master_port_given = false;    // --master-port was on the command line
  std::string rdzv_id;               // --rdzv-id; empty = the launcher's default job id
  std::string log_dir;               // empty = no per-rank log files
  int max_restarts = 0;              // whole-group restarts after a failure
  double grace_seconds = 5.0;        // SIGTERM -> SIGKILL grace during teardown
  double notice_seconds = 3.0;       // first failure -> SIGTERM: survivors raise their own error
  bool help = false;                 // --help: print usage, run nothing
  std::vector<std::string> program;  // PROGRAM and its ARGS; argv[0] first

  int world_size() const { return nnodes * nproc_per_node; }
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

// Parses the launcher's arguments (without argv[0]) with CLI11. Options end at the first
// non-option or at "--". Accepts "--flag value" and "--flag=value" ("--flag=" is an empty
// value, never the next argument); torchrun's underscore spellings (--nproc_per_node) are
// accepted as aliases; a repeated flag is checked each time and the last one wins.
// Throws UsageError, naming the flag, on any bad input.
LaunchOptions parse_args(const std::vector<std::string>& args);

// The --help text.
std::string usage_text();

}  // namespace lockstep::launch
