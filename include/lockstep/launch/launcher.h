// lockstep/launch/launcher.h: running a group of ranks under supervision.
//
// run_launcher spawns nproc_per_node ranks, forwards their output with "[rank N] "
// prefixes, tears the whole group down on the first failure (after the notice period, in
// which the others may exit with their own error; then SIGTERM, then SIGKILL after the
// grace period), prints a summary naming the rank that failed first with its error file
// (error_file.h), restarts it up to max_restarts times, and returns the exit code main
// should use. It never calls exit(). Call it from a single-threaded process: it forks, and
// it installs handlers for SIGINT, SIGTERM, SIGHUP, SIGCHLD and ignores SIGPIPE while running.
#pragma once

#include <string>

#include "lockstep/launch/options.h"

namespace lockstep::launch {

// Exit codes beyond the ranks' own (a failed rank's code, or 128 + its signal).
constexpr int kExitUsage = 2;          // bad command line
constexpr int kExitLauncherError = 1;  // the launcher itself could not run the group
constexpr int kExitCannotExecute = 127;

// Runs the job described by opt; returns the process exit code. Throws lockstep::Error
// only for problems before any rank starts (e.g. the log directory cannot be created).
int run_launcher(const LaunchOptions& opt);

// Binds a TCP socket to addr:0, reads the port the kernel picked, closes it. Another
// process may take the port before rank 0 binds it (small race, as in torchrun).
int pick_free_port(const std::string& addr = "127.0.0.1");

}  // namespace lockstep::launch
