// lockstep-bench faults: the options its driver and its workers share, and the workers.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::bench {

struct FaultsOptions {
  int replicas = 3;
  int64_t steps = 3000;
  double step_ms = 20;       // a step's compute, emulated (the replicas share 2 cores here)
  double fault_every = 1.5;  // seconds between injected faults (uniform in [0.5, 1.5] x this)
  double stops = 0;          // share of the faults that are SIGSTOP (SIGCONT after stop_seconds)
  double stop_seconds = 5;
  int64_t ballast = 1 << 18;       // float32 values reduced with the gradients each step
  int64_t checkpoint_every = 100;  // the restart path's checkpoints, in steps
  double timeout = 900;            // a job still running after this long has hung
  std::string backend = "shm";
  bool restart_path = true;  // also run today's path (--max-restarts + resume) under faults
  uint64_t seed = 1;
  std::string analyze;   // report a job run elsewhere from its folder
  std::string baseline;  // with analyze: the fault-free run's folder
  // Worker side.
  bool worker = false;
  std::string mode;  // "ft" (lockstep::ft::Manager) or "restart" (init() + checkpoints)
  std::string dir;   // where workers write pids, logs and checkpoints
};

// The workers, in a process lockstep-run started. Each appends one line per step attempt
// to DIR/log_<id> (written at once: a killed worker's lines survive it) and keeps its pid
// in DIR/pid_<id>. Return the exit status.
int faults_ft_worker(const FaultsOptions& o);
int faults_restart_worker(const FaultsOptions& o);

}  // namespace lockstep::bench
