// init()'s rendezvous: rank 0's store, the handshake, the join (rendezvous.h).
#include "comm/rendezvous.h"

#include <lockstep/error.h>

#include "comm/backend_factories.h"
#include "comm/rdzv_auth.h"
#include "comm/store_channel.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

namespace lockstep::comm {
namespace {

bool is_port_in_use(const std::string& msg) {
  return msg.find("in use") != std::string::npos || msg.find("EADDRINUSE") != std::string::npos ||
         msg.find("failed to listen") != std::string::npos;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// libtorch's TCPStore listens on every interface and takes no address to bind. For a
// single-node job rank 0 then ties its listening socket to the loopback device
// (SO_BINDTODEVICE "lo", allowed unprivileged since Linux 5.7): connections that arrive
// from another host are refused. Returns false when it could not (older kernel).
bool restrict_store_to_loopback(int port) {
  bool found = false, ok = true;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return false;
  while (dirent* d = readdir(dir)) {
    const int fd = std::atoi(d->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage sa{};
    len = sizeof sa;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) continue;
    int p = -1;
    if (sa.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
    if (sa.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port);
    if (p != port) continue;
    found = true;
    ok = setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3) == 0 && ok;
  }
  closedir(dir);
  return found && ok;
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
  if (e.world_size > 1) handshake(store, e);
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
    auto store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, o);
    // Only a loopback MASTER_ADDR (lockstep-run's default on one node): ranks that dial the
    // host's own routable address (a pod's Service name) arrive on another device.
    if (o.isServer && is_loopback(e.master_addr) && !restrict_store_to_loopback(e.master_port))
      std::fprintf(stderr,
                   "lockstep: warning: could not restrict the rendezvous store on port %d to "
                   "loopback (SO_BINDTODEVICE needs Linux 5.7); it accepts other hosts too\n",
                   e.master_port);
    return store;
  } catch (const std::exception& ex) {
    CommContext c;
    c.rank = e.rank;
    c.world_size = e.world_size;
    c.op = "rendezvous";
    const std::string where = e.master_addr + ":" + std::to_string(e.master_port);
    if (e.rank == 0 && is_port_in_use(ex.what()))
      throw ConfigError(lockstep::detail::concat(
          "rank 0 cannot host the rendezvous store on ", where,
          ": the port is in use. Pick "
          "another with MASTER_PORT (lockstep-run --master-port N, or 0 to choose a free one)"));
    if (e.rank == 0) throw CommError(CommError::Kind::Rendezvous, c, ex.what());
    c.peer = 0;
    c.timeout_s = std::chrono::duration<double>(timeout).count();
    throw CommError(
        CommError::Kind::Rendezvous, c,
        lockstep::detail::concat("could not reach rank 0's store at ", where,
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
        lockstep::detail::concat("lost the connection to rank 0's store (rank 0 exited or gave up "
                                 "waiting): ",
                                 ex.what()));
  }
}

// Under mpirun (any backend but mpi): the store whose address MPI carries
// (mpi_bootstrap_store, backend_factories.h) instead of MASTER_ADDR/MASTER_PORT; fills e's.
StorePtr mpirun_store(LaunchEnv& e, Millis timeout) {
  static std::mutex mu;
  static bool ready = false;
  StorePtr store = mpi_bootstrap_store(e, timeout);
  std::lock_guard<std::mutex> lock(mu);
  if (!ready) {
    if (e.rank == 0 && is_loopback(e.master_addr) && !restrict_store_to_loopback(e.master_port))
      std::fprintf(stderr,
                   "lockstep: warning: could not restrict the rendezvous store on port %d to "
                   "loopback (SO_BINDTODEVICE needs Linux 5.7); it accepts other hosts too\n",
                   e.master_port);
    handshake(store, e);
    ready = true;
  }
  return store;
}

}  // namespace

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string store_get(const StorePtr& store, const std::string& k) {
  auto v = store->get(k);
  return std::string(v.begin(), v.end());
}

void store_set(const StorePtr& store, const std::string& k, const std::string& v) {
  store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
}

bool bootstraps_through_mpi(const LaunchEnv& e) {
  return e.launcher == "mpirun" && e.world_size > 1 && mpi_available();
}

StorePtr job_store(LaunchEnv& e, Millis timeout) {
  return bootstraps_through_mpi(e) ? mpirun_store(e, timeout) : shared_store(e, timeout);
}

std::string next_prefix() {
  static std::atomic<int> generation{0};
  return "lockstep/" + std::to_string(generation++) + "/";
}

std::vector<std::string> join(const StorePtr& store, const std::string& prefix, const LaunchEnv& e,
                              Millis timeout, const std::string& payload) {
  const std::string mine = prefix + "join/" + std::to_string(e.rank);
  store_set(store, mine, seal(store, e, mine, payload));
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
                      lockstep::detail::concat(missing.size(), " of ", e.world_size,
                                               " ranks never joined: missing rank(s) ", list));
    }
    std::this_thread::sleep_for(Millis(20));
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < e.world_size; ++r) {
    const std::string k = prefix + "join/" + std::to_string(r);
    hosts.push_back(unseal(store, e, k, store_get(store, k), r));
  }
  return hosts;
}

// Groups whose backend shares no memory get their own connection to rank 0's store for the
// DETAIL fingerprint check and the stall inspector (keys under prefix + "side/"): a call
// stuck there never holds up the connection that later groups rendezvous through.
ProcessGroupOptions with_side_store(ProcessGroupOptions pgo, const std::string& backend,
                                    const LaunchEnv& e, const std::string& prefix) {
  if (backend == "shm" || e.world_size == 1 || (!pgo.detail && pgo.stall_warn.count() == 0))
    return pgo;
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(e.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = std::min<Millis>(pgo.timeout, std::chrono::seconds(30));
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, o);
    pgo.side_store = std::make_shared<StoreChannel>(std::move(store), prefix + "side/");
  } catch (const std::exception& ex) {
    // Diagnostics only: the group works without them (DETAIL then checks by allgather).
    std::fprintf(stderr,
                 "lockstep: warning: rank %d: no second connection to the store at %s:%d for the "
                 "stall inspector and LOCKSTEP_DEBUG=DETAIL (%s); the stall inspector shows this "
                 "rank's own waits only\n",
                 e.rank, e.master_addr.c_str(), e.master_port, ex.what());
  }
  return pgo;
}

}  // namespace lockstep::comm
