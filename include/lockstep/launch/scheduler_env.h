// lockstep/launch/scheduler_env.h: what a scheduler tells lockstep-run about its node.
//
// lockstep-run started once per node by a scheduler learns the job's shape from it instead
// of from flags (docs/schedulers.md has each contract and its sources):
//   Slurm: one task per node under srun (srun --ntasks-per-node=1 lockstep-run ...):
//     nnodes = SLURM_STEP_NUM_NODES, node rank = SLURM_NODEID, master = the first host of
//     SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), job id slurm-JOB.STEP and a port
//     derived from it. These are facts of the step: a flag or PET_* that disagrees with
//     them is an error (two jobs instead of one), and so is more than one task per node.
//   PyTorchJob (Kubeflow training-operator): RANK = the pod's index, WORLD_SIZE = the pods
//     (or pods x nprocPerNode), MASTER_ADDR, MASTER_PORT.
//   PET_* (TrainJob, and PyTorchJob's torchrun defaults): applied afterwards as the defaults
//     of lockstep-run's flags, as torchrun reads them (options.cpp); explicit flags win.
// Pure functions over an environment map, so every contract is unit-tested with injected
// variables. Errors are UsageError naming the variables and the fix.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "lockstep/launch/options.h"

namespace lockstep::launch {

struct SchedulerContract {
  std::string name;    // "Slurm", "PyTorchJob"; empty = none (PET_* alone may still apply)
  std::string source;  // "NAME=value ..." of the variables read
  std::optional<int> nnodes;
  std::optional<int> node_rank;
  std::optional<int> master_port;
  std::optional<std::string> master_addr;
  std::optional<std::string> rdzv_id;
  std::optional<int> pod_world_size;  // PyTorchJob's WORLD_SIZE, checked against the flags
  bool facts = false;  // Slurm: nnodes / node rank are the step's, a disagreeing flag is an error
  std::string note;    // a remark for the user (a Slurm allocation but no srun); empty = none
};

// Reads the scheduler's contract from env. Throws UsageError on malformed values and on a
// step that runs more than one lockstep-run per node.
SchedulerContract read_scheduler(const std::map<std::string, std::string>& env);

// Applies the contract's values to opt (before PET_* and the command line).
void apply_scheduler(const SchedulerContract& c, LaunchOptions& opt);

// After the command line: a flag or PET_* value that contradicts the scheduler's facts, or
// a PyTorchJob WORLD_SIZE that matches neither the pods nor pods x processes, throws
// UsageError naming both sides.
void check_scheduler(const SchedulerContract& c, const LaunchOptions& opt);

// The one line lockstep-run prints: the contract, the variables read, the values taken.
// Empty when neither a scheduler nor PET_* supplied anything.
std::string describe_launch(const SchedulerContract& c, const LaunchOptions& opt);

}  // namespace lockstep::launch
