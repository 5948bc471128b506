// init(), init_split() and make_group(): a process group from the launch environment. The
// jobs they tie together live one per file: the options and the LOCKSTEP_* environment
// (init_options.cpp), the store and the join (rendezvous.cpp), the token's proofs
// (rdzv_auth.cpp) and the backend choice (backend_choice.cpp).
#include <lockstep/comm/host_cache.h>
#include <lockstep/comm/init.h>
#include <lockstep/comm/make_group.h>
#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include "comm/backend_choice.h"
#include "comm/backend_factories.h"
#include "comm/blas_check.h"
#include "comm/init_options.h"
#include "comm/rendezvous.h"

namespace lockstep::comm {

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  LaunchEnv e = options.env ? *options.env : LaunchEnv::from_environment();
  e.announce();  // which launch contract, on rank 0 for schedulers (docs/schedulers.md)
  const std::string backend = resolve_backend(options.backend, e);
  const ProcessGroupOptions pgo = group_options(options);
  check_blas(e, debug_on());
  if (host_cache_wanted()) install_host_cache();
  if (backend == "mpi")
    return std::make_shared<ProcessGroup>(make_mpi_backend(e, pgo.timeout), pgo);
  const std::string prefix = next_prefix();
  StorePtr store = job_store(e, pgo.timeout);
  const Joined j = parse_joined(join(store, prefix, e, pgo.timeout, join_payload(e)));
  const ProcessGroupOptions side = with_side_store(pgo, backend, e, prefix);
  if (backend == "hier") return hier_group(store, prefix, e, j, hier_requested(options), side);
  return store_group(backend, store, prefix, e, j.hosts, side);
}

namespace {

// The members of `color` among every rank's join entry ("<color> <host>"), in world rank
// order, as a launch environment of their own; their hosts in *hosts.
LaunchEnv members(const LaunchEnv& e, int color, const std::vector<std::string>& all,
                  const std::string& me, std::vector<std::string>* hosts) {
  LaunchEnv sub = e;
  sub.world_size = sub.local_world_size = 0;
  for (int r = 0; r < e.world_size; ++r) {
    const auto space = all[r].find(' ');
    if (std::stoi(all[r].substr(0, space)) != color) continue;
    const std::string host = all[r].substr(space + 1);
    if (r == e.rank) sub.rank = sub.world_size;
    if (host == me) {
      if (r == e.rank) sub.local_rank = sub.local_world_size;
      ++sub.local_world_size;
    }
    hosts->push_back(host);
    ++sub.world_size;
  }
  return sub;
}

}  // namespace

std::shared_ptr<ProcessGroup> init_split(int color, const InitOptions& options) {
  LaunchEnv e = options.env ? *options.env : LaunchEnv::from_environment();
  const std::string backend = resolve_backend(options.backend, e);
  LOCKSTEP_CHECK(color >= 0, "init_split: color must be >= 0, got ", color);
  const ProcessGroupOptions pgo = group_options(options);
  if (backend == "mpi")  // MPI_Comm_split over MPI_COMM_WORLD, key = world rank
    return std::make_shared<ProcessGroup>(make_mpi_backend(e, pgo.timeout, color), pgo);
  const std::string prefix = next_prefix();
  StorePtr store = job_store(e, pgo.timeout);
  const std::string me = hostname();
  const auto all = join(store, prefix, e, pgo.timeout, std::to_string(color) + " " + me);
  std::vector<std::string> hosts;
  const LaunchEnv sub = members(e, color, all, me, &hosts);
  const std::string sub_prefix = prefix + "color" + std::to_string(color) + "/";
  // A subgroup of a hierarchical job is shm on one node, else gloo: the groups hybrid
  // schemes split off (one node; one rank per node) gain nothing from two levels.
  const std::string sub_backend =
      backend != "hier" ? backend : (sub.single_node() ? "shm" : "gloo");
  return store_group(sub_backend, store, sub_prefix, sub, hosts,
                     with_side_store(pgo, sub_backend, sub, sub_prefix));
}

std::shared_ptr<ProcessGroup> make_group(const StorePtr& store, const InitOptions& options,
                                         const std::string& key_prefix) {
  const LaunchEnv e = options.env ? *options.env : LaunchEnv::from_environment();
  // auto (without LOCKSTEP_BACKEND) means shm on one node, else gloo: the two that need no
  // rendezvous of their own. resolve_backend reads LOCKSTEP_BACKEND and checks the name.
  const char* named = env_value(lockstep::env::kBackend);
  const bool pick = options.backend == "auto" && (!named || std::string(named) == "auto");
  const std::string backend =
      resolve_backend(pick ? (e.single_node() ? "shm" : "gloo") : options.backend, e);
  if (backend == "mpi")
    throw ConfigError(
        "make_group builds shm, gloo, hier or nccl groups over the caller's "
        "store, not mpi; use lockstep::init() for mpi");
  if (backend == "hier") {  // the join tells each rank its node's layout
    const ProcessGroupOptions pgo = group_options(options);
    const Joined j = parse_joined(join(store, key_prefix, e, pgo.timeout, join_payload(e)));
    return hier_group(store, key_prefix, e, j, /*requested=*/false, pgo);
  }
  if (backend == "shm" && !e.single_node())
    throw ConfigError(lockstep::detail::concat(
        "backend shm needs every rank on one node, but rank ", e.rank, " has ", e.local_world_size,
        " of ", e.world_size, " ranks on its node; use gloo across nodes"));
  return store_group(backend, store, key_prefix, e, {}, group_options(options));
}

}  // namespace lockstep::comm
