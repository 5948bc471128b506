// The schedulers' contracts for lockstep-run (lockstep/launch/scheduler_env.h; names in
// lockstep/env_contract.h; each contract with its sources: docs/schedulers.md).
#include "lockstep/launch/scheduler_env.h"

#include "lockstep/env_contract.h"
#include "lockstep/hostlist.h"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>

namespace lockstep::launch {
namespace {

using lockstep::detail::concat;
using Env = std::map<std::string, std::string>;
namespace n = lockstep::env;

const char* get(const Env& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : it->second.c_str();
}

int parse_int(const Env& env, const char* name, long lo, long hi) {
  const char* v = get(env, name);
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi)
    throw UsageError(
        concat("lockstep-run: ", name, "='", v, "' is not an integer in ", lo, "..", hi));
  return static_cast<int>(x);
}

void add_source(SchedulerContract& c, const Env& env, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const char* v = get(env, name))
      c.source += concat(c.source.empty() ? "" : " ", name, "=", v);
}

// This lockstep-run is itself a rank of another launcher (nested): the variables around it
// describe that launcher's ranks, not nodes.
bool inside_a_rank(const Env& env) {
  return get(env, n::kLocalRank) || get(env, n::kLauncher) || get(env, n::kGroupRank);
}

// srun one task per node. Its tasks are this job's nodes.
SchedulerContract read_slurm(const Env& env) {
  SchedulerContract c;
  c.name = "Slurm";
  c.facts = true;
  const int tasks = parse_int(env, n::kSlurmStepNumTasks, 1, 1 << 20);
  const char* nodes_var = get(env, n::kSlurmStepNumNodes) ? n::kSlurmStepNumNodes : n::kSlurmNNodes;
  const int nodes = get(env, nodes_var) ? parse_int(env, nodes_var, 1, 1 << 20) : tasks;
  if (tasks != nodes)
    throw UsageError(concat(
        "lockstep-run: srun started ", n::kSlurmStepNumTasks, "=", tasks, " tasks on ", nodes_var,
        "=", nodes,
        " nodes, but lockstep-run starts the ranks of its node itself and runs once "
        "per node: srun --ntasks-per-node=1 lockstep-run --nproc-per-node N PROGRAM (or srun "
        "--ntasks-per-node=N PROGRAM without lockstep-run)"));
  c.nnodes = nodes;
  const char* node_var = get(env, n::kSlurmNodeId) ? n::kSlurmNodeId : n::kSlurmProcId;
  c.node_rank = parse_int(env, node_var, 0, nodes - 1);
  add_source(c, env, {n::kSlurmStepNumTasks, nodes_var, node_var});
  const char* list = get(env, n::kSlurmStepNodeList) ? n::kSlurmStepNodeList : n::kSlurmJobNodeList;
  // One node keeps the loopback default: its store then listens on loopback only.
  if (nodes > 1 && get(env, list)) {
    try {
      c.master_addr = hostlist::first(get(env, list));
    } catch (const ConfigError& e) {
      throw UsageError(concat("lockstep-run: ", list, ": ", e.what()));
    }
    add_source(c, env, {list});
  }
  if (const char* job = get(env, n::kSlurmJobId)) {
    const char* step = get(env, n::kSlurmStepId);
    const std::string id = concat(job, ".", step ? step : "0");
    c.rdzv_id = "slurm-" + id;
    c.master_port = n::slurm_port(id.c_str());
    add_source(c, env, {n::kSlurmJobId, n::kSlurmStepId});
  }
  return c;
}

// PyTorchJob's per-pod variables: RANK is the pod's index.
SchedulerContract read_pytorchjob(const Env& env) {
  SchedulerContract c;
  c.name = "PyTorchJob";
  c.node_rank = parse_int(env, n::kRank, 0, 1 << 20);
  c.pod_world_size = parse_int(env, n::kWorldSize, 1, 1 << 30);
  c.nnodes = c.pod_world_size;  // PET_NNODES (applied next) says it when WORLD_SIZE counts ranks
  if (const char* a = get(env, n::kMasterAddr)) c.master_addr = a;
  if (get(env, n::kMasterPort)) c.master_port = parse_int(env, n::kMasterPort, 1, 65535);
  add_source(c, env, {n::kRank, n::kWorldSize, n::kMasterAddr, n::kMasterPort});
  return c;
}

// A Slurm job with several tasks or nodes whose lockstep-run was started without srun.
std::string slurm_note(const Env& env) {
  if (!get(env, n::kSlurmJobId)) return "";
  const char* nodes = get(env, n::kSlurmJobNumNodes) ? n::kSlurmJobNumNodes : n::kSlurmNNodes;
  if (!get(env, nodes) || std::string(get(env, nodes)) == "1") return "";
  return concat("inside Slurm job ", get(env, n::kSlurmJobId), " (", nodes, "=", get(env, nodes),
                ") but not started by srun: this node runs alone; start one lockstep-run per "
                "node with srun --ntasks-per-node=1 lockstep-run ... (docs/schedulers.md)");
}

}  // namespace

SchedulerContract read_scheduler(const Env& env) {
  if (inside_a_rank(env)) return {};
  const bool slurm = get(env, n::kSlurmProcId) && get(env, n::kSlurmStepNumTasks);
  const bool pod = get(env, n::kRank) && get(env, n::kWorldSize) &&
                   (get(env, n::kKubernetesServiceHost) || get(env, n::kPetNNodes));
  if (slurm && pod)
    throw UsageError(concat("lockstep-run: conflicting launch environments: a Slurm step (",
                            n::kSlurmProcId, "=", get(env, n::kSlurmProcId),
                            ") and a PyTorchJob pod (", n::kRank, "=", get(env, n::kRank), " ",
                            n::kWorldSize, "=", get(env, n::kWorldSize),
                            "); unset RANK and WORLD_SIZE to run under srun (docs/schedulers.md)"));
  if (slurm) return read_slurm(env);
  if (pod) return read_pytorchjob(env);
  SchedulerContract c;
  c.note = slurm_note(env);
  return c;
}

void apply_scheduler(const SchedulerContract& c, LaunchOptions& opt) {
  if (c.nnodes) opt.nnodes = *c.nnodes;
  if (c.node_rank) opt.node_rank = *c.node_rank;
  if (c.master_addr) opt.master_addr = *c.master_addr;
  if (c.master_port) opt.master_port = *c.master_port;
  if (c.rdzv_id) opt.rdzv_id = *c.rdzv_id;
}

void check_scheduler(const SchedulerContract& c, const LaunchOptions& opt) {
  auto check = [&](const char* flag, int mine, const std::optional<int>& theirs, const char* what) {
    auto it = opt.set_by.find(flag);
    if (!c.facts || !theirs || it == opt.set_by.end() || mine == *theirs) return;
    throw UsageError(concat("lockstep-run: conflicting launch environments: ", it->second, " says ",
                            what, " ", mine, " but the ", c.name, " step says ", *theirs, " (",
                            c.source,
                            "): each node would form a "
                            "job of its own. Leave ",
                            flag, " out: lockstep-run reads it from ", c.name));
  };
  check("--nnodes", opt.nnodes, c.nnodes, "nnodes");
  check("--node-rank", opt.node_rank, c.node_rank, "node rank");
  if (c.pod_world_size && *c.pod_world_size != opt.nnodes && *c.pod_world_size != opt.world_size())
    throw UsageError(
        concat("lockstep-run: conflicting launch environments: PyTorchJob's ", n::kWorldSize, "=",
               *c.pod_world_size, " is neither the number of pods (", opt.nnodes,
               ") nor pods x processes per pod (", opt.nnodes, " x ", opt.nproc_per_node,
               "); set nprocPerNode in the PyTorchJob to the "
               "--nproc-per-node given to lockstep-run"));
}

std::string describe_launch(const SchedulerContract& c, const LaunchOptions& opt) {
  std::string pet;
  for (const auto& [flag, from] : opt.set_by)
    if (from.rfind("PET_", 0) == 0) pet += (pet.empty() ? "" : " ") + from;
  if (c.name.empty() && pet.empty()) return "";
  std::string from =
      c.name.empty() ? (pet.find(n::kPetNNodes) != std::string::npos ? "TrainJob (PET_*)"
                                                                     : "torchrun's PET_* defaults")
                     : c.name;
  std::string vars = c.source;
  if (!pet.empty()) vars += (vars.empty() ? "" : " ") + pet;
  return concat(from, " (", vars, "): node ", opt.node_rank, " of ", opt.nnodes, ", ",
                opt.nproc_per_node, " rank(s) on this node, master ", opt.master_addr, ":",
                opt.master_port, opt.rdzv_id.empty() ? std::string() : ", job id " + opt.rdzv_id);
}

}  // namespace lockstep::launch
