// Which backend a group gets, and building it (backend_choice.h).
#include "comm/backend_choice.h"

#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include "comm/backend_factories.h"
#include "comm/backends/hier/hier_backend.h"
#include "comm/init_options.h"
#include "comm/rendezvous.h"

#include <cstdio>
#include <sstream>

namespace lockstep::comm {
namespace {

// The store must outlive the group: rank 0 hosts it for every other rank.
std::shared_ptr<ProcessGroup> own_store(std::unique_ptr<Backend> b, const StorePtr& store,
                                        const ProcessGroupOptions& pgo) {
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(b), pgo),
                                       [store](ProcessGroup* pg) { delete pg; });
}

std::unique_ptr<Backend> hier_or_flat_backend(const StorePtr& store, const std::string& prefix,
                                              const LaunchEnv& e, const Joined& j, bool requested,
                                              Millis timeout) {
  const std::string across = bootstraps_through_mpi(e) ? "mpi" : "gloo";
  std::string why;
  const auto layout = hier_layout(e.rank, j.local_ranks, j.local_sizes, j.hosts, &why);
  if (layout && (layout->per_node > 1 || requested))
    return make_hier_backend(store, prefix, e, *layout, across, timeout);
  if (requested)
    throw ConfigError(
        lockstep::detail::concat("LOCKSTEP_BACKEND=hier needs the same number of ranks on "
                                 "every node, numbered node by node, but ",
                                 why, "; use LOCKSTEP_BACKEND=", across));
  if (e.rank == 0 && !layout)
    std::fprintf(stderr, "lockstep: %s across all ranks, not hierarchical: %s\n", across.c_str(),
                 why.c_str());
  return across == "mpi" ? make_mpi_backend(e, timeout)
                         : make_gloo_backend(store, prefix, e, timeout);
}

}  // namespace

std::string resolve_backend(const std::string& requested, const LaunchEnv& env_) {
  std::string b = requested;
  if (b == "auto")
    if (const char* e = env_value(lockstep::env::kBackend)) b = e;
  if (b != "auto" && b != "shm" && b != "gloo" && b != "mpi" && b != "nccl" && b != "hier")
    throw ConfigError(lockstep::detail::concat("unknown backend '", b, "' (from ",
                                               lockstep::env::kBackend,
                                               " or InitOptions::backend); "
                                               "choose auto, shm, gloo, hier, mpi or nccl"));
  if (b != "auto") return b;
  // Under mpirun too: there the store is bootstrapped through MPI (job_store), and hier
  // crosses nodes with mpi.
  if (env_.single_node()) return "shm";
  if (env_.local_world_size > 1) return "hier";
  return env_.launcher == "mpirun" && mpi_available() ? "mpi" : "gloo";
}

// What each rank says of itself at the join: where it sits on its node, and the node.
std::string join_payload(const LaunchEnv& e) {
  return lockstep::detail::concat(e.local_rank, " ", e.local_world_size, " ", hostname());
}

Joined parse_joined(const std::vector<std::string>& payloads) {
  Joined j;
  for (const std::string& p : payloads) {
    std::istringstream in(p);
    int l = 0, s = 0;
    std::string host;
    in >> l >> s;
    std::getline(in >> std::ws, host);
    j.local_ranks.push_back(l);
    j.local_sizes.push_back(s);
    j.hosts.push_back(host);
  }
  return j;
}

std::shared_ptr<ProcessGroup> store_group(const std::string& backend, const StorePtr& store,
                                          const std::string& prefix, const LaunchEnv& e,
                                          const std::vector<std::string>& hosts,
                                          const ProcessGroupOptions& pgo) {
  std::unique_ptr<Backend> b;
  if (backend == "shm") {
    for (size_t r = 0; r < hosts.size(); ++r)
      if (hosts[r] != hosts[0])
        throw ConfigError(lockstep::detail::concat(
            "backend shm needs every rank on one node, but rank 0 is on ", hosts[0], " and rank ",
            r, " on ", hosts[r], "; use gloo or mpi across nodes"));
    b = make_shm_backend(store, prefix, e, pgo.timeout);
  } else if (backend == "nccl") {  // docs/gpu.md; ConfigError in a build without CUDA
    b = make_nccl_backend(store, prefix, e, pgo.timeout);
  } else {
    b = make_gloo_backend(store, prefix, e, pgo.timeout);
  }
  return own_store(std::move(b), store, pgo);
}

std::shared_ptr<ProcessGroup> hier_group(const StorePtr& store, const std::string& prefix,
                                         const LaunchEnv& e, const Joined& joined, bool requested,
                                         const ProcessGroupOptions& pgo) {
  return own_store(hier_or_flat_backend(store, prefix, e, joined, requested, pgo.timeout), store,
                   pgo);
}

}  // namespace lockstep::comm
