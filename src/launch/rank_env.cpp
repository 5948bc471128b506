// The torchrun environment contract for each rank (names: lockstep/env_contract.h).
#include "lockstep/launch/rank_env.h"

#include "lockstep/env_contract.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <random>

extern char** environ;

namespace lockstep::launch {

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    std::size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env.emplace(kv.substr(0, eq), kv.substr(eq + 1));  // first definition wins, as getenv
  }
  return env;
}

EnvMap rank_env(const LaunchOptions& opt, int local_rank, const GroupContext& group,
                const EnvMap& base) {
  namespace n = lockstep::env;
  EnvMap env = base;
  const std::string rank = std::to_string(opt.global_rank(local_rank));
  const std::string world = std::to_string(opt.world_size());
  const std::string restarts = std::to_string(group.restart_count);
  const std::string max_restarts = std::to_string(opt.max_restarts);
  env[n::kRank] = rank;
  env[n::kLocalRank] = std::to_string(local_rank);
  env[n::kWorldSize] = world;
  env[n::kLocalWorldSize] = std::to_string(opt.nproc_per_node);
  env[n::kGroupRank] = std::to_string(opt.node_rank);
  env[n::kGroupWorldSize] = std::to_string(opt.nnodes);
  // One role ("default") in a static launch: role ranks equal the global ones, as in torchrun.
  env[n::kRoleRank] = rank;
  env[n::kRoleWorldSize] = world;
  env[n::kMasterAddr] = opt.master_addr;
  env[n::kMasterPort] = std::to_string(group.master_port);
  env[n::kLauncher] = n::kLauncherName;
  env[n::kJobId] = group.job_id;
  env[n::kRestartCount] = restarts;
  env[n::kMaxRestarts] = max_restarts;
  env[n::kTorchelasticRestartCount] = restarts;
  env[n::kTorchelasticMaxRestarts] = max_restarts;
  env[n::kTorchelasticRunId] = group.job_id;
  if (!group.coordinator.empty()) {
    env[n::kCoordinator] = group.coordinator;
    env[n::kReplicaId] = std::to_string(opt.global_rank(local_rank) / opt.replica_size);
    env[n::kReplicas] = std::to_string(opt.replicas());
  }
  if (base.find("OMP_NUM_THREADS") == base.end()) env["OMP_NUM_THREADS"] = "1";
  for (const auto& [k, v] : malloc_defaults(base)) env[k] = v;
  return env;
}

void make_replica_env(const LaunchOptions& opt, int local_rank, int replica_port, int restarts,
                      EnvMap& env) {
  namespace n = lockstep::env;
  const int s = opt.replica_size, shard = local_rank % s;
  const int replica = opt.global_rank(local_rank) / s;
  for (const char* k : {n::kRank, n::kLocalRank, n::kRoleRank}) env[k] = std::to_string(shard);
  for (const char* k : {n::kWorldSize, n::kLocalWorldSize, n::kRoleWorldSize})
    env[k] = std::to_string(s);
  env[n::kMasterAddr] = "127.0.0.1";
  env[n::kMasterPort] = std::to_string(replica_port);
  env[n::kReplicaSize] = std::to_string(s);
  env[n::kJobId] =
      env[n::kJobId] + ".replica" + std::to_string(replica) + "." + std::to_string(restarts);
  env[n::kTorchelasticRunId] = env[n::kJobId];
}

EnvMap malloc_defaults(const EnvMap& base) {
  // glibc serves every allocation above 32 MiB with a fresh mmap() and unmaps it on
  // free, so a step that allocates the same large gradients every time page-faults
  // through all of them every time (lockstep-bench ddp, 1 rank: 165 ms a step, 120 without).
  // Keeping them in the heap, and the heap untrimmed, reuses the pages instead.
  auto tunables = base.find("GLIBC_TUNABLES");
  if (tunables != base.end() && tunables->second.find("glibc.malloc.") != std::string::npos)
    return {};  // the user tunes malloc
  EnvMap out;
  // A user's mmap threshold says which blocks they want mmap()ed: keep mmap on for it.
  if (base.find("MALLOC_MMAP_MAX_") == base.end() &&
      base.find("MALLOC_MMAP_THRESHOLD_") == base.end())
    out["MALLOC_MMAP_MAX_"] = "0";
  if (base.find("MALLOC_TRIM_THRESHOLD_") == base.end())
    out["MALLOC_TRIM_THRESHOLD_"] = "17179869184";  // 16 GiB: never, in practice
  return out;
}

bool should_note_omp(const LaunchOptions& opt, const EnvMap& base) {
  return opt.nproc_per_node > 1 && base.find("OMP_NUM_THREADS") == base.end();
}

std::vector<std::string> to_envp(const EnvMap& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) {
    std::string& e = out.emplace_back(k);
    e += '=';
    e += v;
  }
  return out;
}

std::string make_job_id() {
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string h;
  // Keep only characters that are safe in a shm_open name and a file name.
  for (const char* c = host; *c; ++c) {
    bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-';
    h.push_back(ok ? *c : '_');
    if (h.size() >= 32) break;
  }
  if (h.empty()) h = "host";
  auto start_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  // A random part too: two launches in the same millisecond (pid namespaces) still differ.
  std::random_device rd;
  char rnd[9];
  std::snprintf(rnd, sizeof rnd, "%08x", static_cast<unsigned>(rd()));
  return h + "-" + std::to_string(getpid()) + "-" + std::to_string(start_ms) + "-" + rnd;
}

}  // namespace lockstep::launch
