// init(): read the environment, rendezvous through a c10d store, build the backend.
#include <lockstep/comm/init.h>
#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include "comm/backends/factories.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

namespace lockstep::comm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

constexpr double kMaxTimeoutS = 30 * 24 * 3600;  // 30 days: far beyond any op, no overflow

Millis default_timeout(const InitOptions& o) {
  if (o.timeout) return *o.timeout;
  if (const char* s = env(lockstep::env::kTimeoutSeconds)) {
    char* end = nullptr;
    double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= 0.001 && v <= kMaxTimeoutS))
      throw ConfigError(detail::concat(lockstep::env::kTimeoutSeconds, "='", s,
                                       "' is not a number of seconds between 0.001 and ",
                                       kMaxTimeoutS));
    return Millis(static_cast<int64_t>(v * 1000));
  }
  return ProcessGroupOptions{}.timeout;
}

void check_timeout(Millis t) {
  if (t.count() < 1 || t.count() > kMaxTimeoutS * 1000)
    throw ConfigError(detail::concat("InitOptions::timeout of ", t.count(),
                                     " ms is outside 1 ms .. ", kMaxTimeoutS, " s"));
}

bool check_collectives(const InitOptions& o) {
  if (o.check_collectives) return *o.check_collectives;
  if (const char* s = env(lockstep::env::kCheckCollectives)) {
    const std::string v = s;
    if (v != "0" && v != "1")
      throw ConfigError(
          detail::concat(lockstep::env::kCheckCollectives, "='", v, "' must be 0 or 1"));
    return v == "1";
  }
  return true;
}

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

bool is_port_in_use(const std::string& msg) {
  return msg.find("in use") != std::string::npos || msg.find("EADDRINUSE") != std::string::npos ||
         msg.find("failed to listen") != std::string::npos;
}

StorePtr connect_store(const LaunchEnv& e, Millis timeout);

// Groups of one job share rank 0's store (it can be hosted only once per port): a later
// init() reuses the store of an earlier group that is still alive, under a new key prefix.
StorePtr shared_store(const LaunchEnv& e, Millis timeout) {
  static std::mutex mu;
  static std::map<std::string, c10::weak_intrusive_ptr<c10d::Store>> live;
  const std::string key = e.master_addr + ":" + std::to_string(e.master_port) + "/" +
                          std::to_string(e.rank) + "/" + std::to_string(e.world_size);
  std::lock_guard<std::mutex> lock(mu);
  auto it = live.find(key);
  if (it != live.end())
    if (StorePtr alive = it->second.lock()) return alive;
  StorePtr store = connect_store(e, timeout);
  live.insert_or_assign(key, c10::weak_intrusive_ptr<c10d::Store>(store));
  return store;
}

StorePtr connect_store(const LaunchEnv& e, Millis timeout) {
  if (e.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(e.master_port);
  o.isServer = e.rank == 0;
  o.waitWorkers = false;  // our own join below names the ranks that are missing
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(e.master_addr, o);
  } catch (const std::exception& ex) {
    CommContext c;
    c.rank = e.rank;
    c.world_size = e.world_size;
    c.op = "rendezvous";
    const std::string where = e.master_addr + ":" + std::to_string(e.master_port);
    if (e.rank == 0 && is_port_in_use(ex.what()))
      throw ConfigError(detail::concat(
          "rank 0 cannot host the rendezvous store on ", where,
          ": the port is in use. Pick "
          "another with MASTER_PORT (lockstep-run --master-port N, or 0 to choose a free one)"));
    if (e.rank == 0) throw CommError(CommError::Kind::Rendezvous, c, ex.what());
    c.peer = 0;
    c.timeout_s = std::chrono::duration<double>(timeout).count();
    throw CommError(CommError::Kind::Rendezvous, c,
                    detail::concat("could not reach rank 0's store at ", where,
                                   ": rank 0 has not started, or MASTER_ADDR/MASTER_PORT point "
                                   "elsewhere (",
                                   ex.what(), ")"));
  }
}

bool store_check(const StorePtr& store, const std::string& key, const LaunchEnv& e) {
  try {
    return store->check({key});
  } catch (const std::exception& ex) {
    CommContext c;
    c.rank = e.rank;
    c.world_size = e.world_size;
    c.op = "rendezvous";
    c.peer = 0;
    throw CommError(
        CommError::Kind::Rendezvous, c,
        detail::concat("lost the connection to rank 0's store (rank 0 exited or gave up "
                       "waiting): ",
                       ex.what()));
  }
}

// Every rank announces itself, then waits for all; on timeout the message lists who is missing.
// Returns every rank's `payload` (by default its hostname).
std::vector<std::string> join(const StorePtr& store, const std::string& prefix, const LaunchEnv& e,
                              Millis timeout, const std::string& payload = hostname()) {
  const std::string& me = payload;
  store->set(prefix + "join/" + std::to_string(e.rank), std::vector<uint8_t>(me.begin(), me.end()));
  const auto start = Clock::now();
  // Rank 0 hosts the store: it waits a little longer, so the others can read the store
  // (and report the missing ranks themselves) until they give up.
  const auto limit = timeout + (e.rank == 0 ? Millis(2000) : Millis(0));
  std::vector<bool> seen(e.world_size, false);
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < e.world_size; ++r) {
      if (!seen[r]) seen[r] = store_check(store, prefix + "join/" + std::to_string(r), e);
      if (!seen[r]) missing.push_back(r);
    }
    if (missing.empty()) break;
    if (Clock::now() - start > limit) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      CommContext c;
      c.rank = e.rank;
      c.world_size = e.world_size;
      c.op = "rendezvous";
      c.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
      c.timeout_s = std::chrono::duration<double>(timeout).count();
      throw CommError(CommError::Kind::Rendezvous, c,
                      detail::concat(missing.size(), " of ", e.world_size,
                                     " ranks never joined: missing rank(s) ", list));
    }
    std::this_thread::sleep_for(Millis(20));
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < e.world_size; ++r) {
    auto v = store->get(prefix + "join/" + std::to_string(r));
    hosts.emplace_back(v.begin(), v.end());
  }
  return hosts;
}

}  // namespace

std::string resolve_backend(const std::string& requested, const LaunchEnv& env_) {
  std::string b = requested;
  if (b == "auto")
    if (const char* e = env(lockstep::env::kBackend)) b = e;
  if (b != "auto" && b != "shm" && b != "gloo" && b != "mpi")
    throw ConfigError(detail::concat("unknown backend '", b, "' (from ", lockstep::env::kBackend,
                                     " or InitOptions::backend); "
                                     "choose auto, shm, gloo or mpi"));
  if (b != "auto") return b;
  if (env_.launcher == "mpirun" && mpi_available()) return "mpi";
  return env_.single_node() ? "shm" : "gloo";
}

namespace {

ProcessGroupOptions group_options(const InitOptions& options) {
  ProcessGroupOptions pgo;
  pgo.timeout = default_timeout(options);
  check_timeout(pgo.timeout);
  pgo.check_collectives = check_collectives(options);
  return pgo;
}

// Groups made in the same order on every rank get the same key namespace.
std::string next_prefix() {
  static std::atomic<int> generation{0};
  return "lockstep/" + std::to_string(generation++) + "/";
}

// The shm or gloo group of the ranks in `e` (hosts: each one's hostname), rendezvousing
// under `prefix` in `store`, which must outlive the group.
std::shared_ptr<ProcessGroup> make_group(const std::string& backend, const StorePtr& store,
                                         const std::string& prefix, const LaunchEnv& e,
                                         const std::vector<std::string>& hosts,
                                         const ProcessGroupOptions& pgo) {
  std::unique_ptr<Backend> b;
  if (backend == "shm") {
    for (size_t r = 0; r < hosts.size(); ++r)
      if (hosts[r] != hosts[0])
        throw ConfigError(
            detail::concat("backend shm needs every rank on one node, but rank 0 is on ", hosts[0],
                           " and rank ", r, " on ", hosts[r], "; use gloo or mpi across nodes"));
    b = make_shm_backend(store, prefix, e, pgo.timeout);
  } else {
    b = make_gloo_backend(store, prefix, e, pgo.timeout);
  }
  // The store must outlive the group: rank 0 hosts it for every other rank.
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(b), pgo),
                                       [store](ProcessGroup* pg) { delete pg; });
}

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  const LaunchEnv e = options.env ? *options.env : LaunchEnv::from_environment();
  const std::string backend = resolve_backend(options.backend, e);
  const ProcessGroupOptions pgo = group_options(options);
  if (backend == "mpi")
    return std::make_shared<ProcessGroup>(make_mpi_backend(e, pgo.timeout), pgo);
  const std::string prefix = next_prefix();
  StorePtr store = shared_store(e, pgo.timeout);
  const auto hosts = join(store, prefix, e, pgo.timeout);
  return make_group(backend, store, prefix, e, hosts, pgo);
}

std::shared_ptr<ProcessGroup> init_split(int color, const InitOptions& options) {
  const LaunchEnv e = options.env ? *options.env : LaunchEnv::from_environment();
  const std::string backend = resolve_backend(options.backend, e);
  if (backend == "mpi")
    throw ConfigError(
        "process subgroups (init_split) are not available on the mpi backend yet; "
        "use shm or gloo (LOCKSTEP_BACKEND=shm|gloo)");
  LOCKSTEP_CHECK(color >= 0, "init_split: color must be >= 0, got ", color);
  const ProcessGroupOptions pgo = group_options(options);
  const std::string prefix = next_prefix();
  StorePtr store = shared_store(e, pgo.timeout);
  const std::string me = hostname();
  const auto all = join(store, prefix, e, pgo.timeout, std::to_string(color) + " " + me);
  LaunchEnv sub = e;  // the members, in world rank order
  sub.world_size = sub.local_world_size = 0;
  std::vector<std::string> hosts;
  for (int r = 0; r < e.world_size; ++r) {
    const auto space = all[r].find(' ');
    if (std::stoi(all[r].substr(0, space)) != color) continue;
    const std::string host = all[r].substr(space + 1);
    if (r == e.rank) sub.rank = sub.world_size;
    if (host == me) {
      if (r == e.rank) sub.local_rank = sub.local_world_size;
      ++sub.local_world_size;
    }
    hosts.push_back(host);
    ++sub.world_size;
  }
  return make_group(backend, store, prefix + "color" + std::to_string(color) + "/", sub, hosts,
                    pgo);
}

}  // namespace lockstep::comm
