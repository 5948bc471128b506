// mpi_bootstrap_store(): a c10d store for a job that mpirun started, its address carried by
// MPI instead of MASTER_ADDR/MASTER_PORT.
//
// Under mpirun every rank already has a working channel to every other (MPI's wire-up),
// but no agreed TCP port: a fixed or hashed one can be taken by another job. Rank 0
// therefore hosts the store on a port the kernel picks (TCPStore with port 0) and
// broadcasts "address port" to the others over MPI; then every rank connects and the
// ordinary rendezvous (shm, gloo, subgroups, shared buffers) runs on that store. MPI stays
// initialized (a later mpi group may use it) and is finalized at exit by mpi_runtime.
#include "comm/backend_factories.h"
#include "comm/backends/mpi/mpi_runtime.h"

#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

namespace lockstep::comm {
namespace {

constexpr int kMsgBytes = 512;  // "<address> <port>", NUL-padded

[[noreturn]] void fail_rendezvous(const LaunchEnv& e, Millis timeout, const std::string& msg) {
  CommContext c;
  c.rank = e.rank;
  c.world_size = e.world_size;
  c.backend = "mpi";
  c.op = "rendezvous";
  c.peer = 0;
  c.timeout_s = std::chrono::duration<double>(timeout).count();
  throw CommError(CommError::Kind::Rendezvous, std::move(c), msg);
}

// Polls a nonblocking MPI call to completion, up to `deadline`: a rank that never comes
// is an error that says so, not a hang in a blocking MPI call.
void wait_request(MPI_Request& req, Clock::time_point deadline, const LaunchEnv& e, Millis timeout,
                  const char* what) {
  for (;;) {
    int done = 0, rc;
    {
      std::lock_guard<std::mutex> g(mpi::call_lock());
      rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS)
      fail_rendezvous(e, timeout,
                      lockstep::detail::concat(what, " failed: ", mpi::error_string(rc)));
    if (done) return;
    if (Clock::now() >= deadline)
      fail_rendezvous(
          e, timeout,
          lockstep::detail::concat("not every rank of MPI_COMM_WORLD reached the bootstrap of "
                                   "the rendezvous store (",
                                   what, ") within the timeout"));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// The address the other ranks reach rank 0's store at: MASTER_ADDR if set, loopback for a
// single-node job, else this host's name.
std::string advertised_address(const LaunchEnv& e) {
  if (const char* a = std::getenv(lockstep::env::kMasterAddr); a && *a) return a;
  if (e.single_node()) return "127.0.0.1";
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

c10::intrusive_ptr<c10d::TCPStore> host_store(const LaunchEnv& e, Millis timeout) {
  c10d::TCPStoreOptions o;
  o.port = 0;  // the kernel picks a free port; getPort() reports it
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  } catch (const std::exception& ex) {
    throw ConfigError(
        lockstep::detail::concat("rank 0 cannot host the rendezvous store: ", ex.what()));
  }
}

}  // namespace

StorePtr mpi_bootstrap_store(LaunchEnv& env, Millis timeout) {
  static std::mutex mu;
  static StorePtr* kept = nullptr;  // leaked on purpose: outlives every group, used at exit
  static std::string addr;
  static int port = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (kept) {
    env.master_addr = addr;
    env.master_port = port;
    return *kept;
  }
  const auto deadline = Clock::now() + timeout;
  int rank = 0, size = 1;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  {
    std::lock_guard<std::mutex> g(mpi::call_lock());
    mpi::ensure_initialized_locked();
    mpi::note_bootstrap();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (env.rank != rank || env.world_size != size)
      throw ConfigError(lockstep::detail::concat(
          "mpi: the launch environment (", env.launcher, ") says rank ", env.rank, " of ",
          env.world_size, " but MPI_COMM_WORLD says rank ", rank, " of ", size,
          "; start the job with mpirun alone, or set LOCKSTEP_BACKEND=mpi"));
    // A private communicator: the program's own collectives on the world never meet ours.
    const int rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req);
    if (rc != MPI_SUCCESS)
      fail_rendezvous(env, timeout, "MPI_Comm_idup failed: " + mpi::error_string(rc));
  }
  wait_request(req, deadline, env, timeout, "MPI_Comm_idup");

  StorePtr store;
  char msg[kMsgBytes] = {0};
  if (rank == 0) {
    auto server = host_store(env, timeout);
    const std::string text =
        lockstep::detail::concat(advertised_address(env), " ", static_cast<int>(server->getPort()));
    LOCKSTEP_CHECK(text.size() < kMsgBytes, "mpi: MASTER_ADDR is too long: ", text);
    std::memcpy(msg, text.data(), text.size());
    store = server;
  }
  {
    std::lock_guard<std::mutex> g(mpi::call_lock());
    const int rc = MPI_Ibcast(msg, kMsgBytes, MPI_CHAR, 0, comm, &req);
    if (rc != MPI_SUCCESS)
      fail_rendezvous(env, timeout, "MPI_Ibcast failed: " + mpi::error_string(rc));
  }
  wait_request(req, deadline, env, timeout, "MPI_Ibcast");
  {
    std::lock_guard<std::mutex> g(mpi::call_lock());
    MPI_Comm_free(&comm);
  }
  std::istringstream in(msg);
  in >> addr >> port;
  LOCKSTEP_CHECK(port > 0 && port < 65536 && !addr.empty(), "mpi: bad store address from rank 0: '",
                 msg, "'");
  if (rank != 0) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = false;
    o.waitWorkers = false;
    o.timeout =
        std::max<Millis>(Millis(1), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
    try {
      store = c10::make_intrusive<c10d::TCPStore>(addr, o);
    } catch (const std::exception& ex) {
      fail_rendezvous(
          env, timeout,
          lockstep::detail::concat("could not reach rank 0's store at ", addr, ":", port,
                                   " (its address came through MPI; set MASTER_ADDR to an "
                                   "address of rank 0's host that this host can reach): ",
                                   ex.what()));
    }
  }
  kept = new StorePtr(store);
  env.master_addr = addr;
  env.master_port = port;
  return store;
}

}  // namespace lockstep::comm
