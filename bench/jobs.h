// How a benchmark's driver runs its worker jobs (this same program, started under
// lockstep-run, mpirun or as plain processes) and how the workers report back: rank 0
// prints "RESULT key value" lines, the driver collects them.
#pragma once

#include <map>
#include <string>

namespace lockstep::bench {

// Worker side: on rank 0, prints "RESULT key value" (and flushes); other ranks print nothing.
void report_result(int rank, const std::string& key, double value);

// Driver side: runs `cmd` through the shell (stderr joined to stdout), echoes every line
// that is not a RESULT line, and returns the RESULT values by key. A job that fails is
// reported on stderr; what it printed before failing is still returned.
std::map<std::string, double> run_job(const std::string& cmd);

// A job's output, for drivers that print their own summary instead of the job's lines.
struct JobOutput {
  std::map<std::string, double> results;  // the RESULT values by key
  int status = 0;                         // the shell's exit status (0: success)
  std::string output;                     // everything else it printed
};

// Runs `cmd` through the shell (stderr joined to stdout) without echoing its lines.
JobOutput run_job_quiet(const std::string& cmd);

// The environment every rank of every side of a benchmark runs with: one compute thread,
// and glibc malloc and OpenBLAS's kernels as lockstep-run sets them up (docs/launcher.md),
// as VAR=value words followed by a space.
std::string rank_environment();

// The OPENBLAS_CORETYPE part of it alone (empty where OpenBLAS picks right by itself).
std::string blas_environment();

// The path of this program, quoted for the shell ('...').
std::string self_command();

// A TCP port on 127.0.0.1 that was free a moment ago (29511 if none could be had).
int free_port();

// Creates the folder that will hold `file` (nothing if it has none).
void make_parent_dir(const std::string& file);

}  // namespace lockstep::bench
