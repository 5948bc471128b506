// The MPI backend: lockstep's collectives on a private duplicate of MPI_COMM_WORLD, or of
// a split of it (subgroups: init_split).
//
// Every op is MPI's nonblocking variant (large allreduces: a ring of nonblocking
// messages, allreduce_ring_mpi.cpp) polled with MPI_Test, so an op can give up
// at its deadline (CommError::Timeout) or when the group aborts (Kind::Aborted):
// blocking MPI calls cannot be interrupted. The poll spins briefly, then yields,
// then sleeps in growing steps up to 1 ms, so ranks oversubscribed on few cores
// let each other run. Counts above MPI's int range are split into chunks
// (allreduce, broadcast, send/recv) or rejected (allgather, reduce_scatter,
// alltoall, whose per-rank blocks would need strided types).
//
// An op abandoned on timeout or abort cannot be cancelled (collectives) or may
// still complete later (point to point), writing into its buffers; the backend
// keeps those tensors alive until the request completes, and past its own
// lifetime if need be (a small leak on a group that is broken anyway).
#include "comm/backends/mpi/mpi_backend.h"

#include "comm/backends/mpi/mpi_departure.h"

#include <lockstep/error.h>

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

namespace lockstep::comm {
namespace {

using mpi::call_lock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Largest count per MPI call; LOCKSTEP_MPI_MAX_COUNT lowers it (tests exercise chunking).
int64_t max_count() {
  static const int64_t v = [] {
    const char* s = std::getenv("LOCKSTEP_MPI_MAX_COUNT");
    int64_t n = s ? std::atoll(s) : 0;
    return (n > 0 && n <= INT_MAX) ? n : static_cast<int64_t>(INT_MAX);
  }();
  return v;
}

// Poll pacing: spin first (latency), then yield (oversubscribed ranks), then sleep.
// OpenMPI advances a large nonblocking collective only inside MPI calls, so the
// yield phase lasts long enough to cover big transfers; sleeping is for long waits
// (a slow peer at a barrier), where giving the core away matters more.
class Backoff {
 public:
  void pause() {
    const auto e = Clock::now() - start_;
    if (e < std::chrono::microseconds(50)) return;
    if (e < std::chrono::seconds(2)) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds sleep_{20};
};

}  // namespace

MpiBackend::MpiBackend(const LaunchEnv& env, Millis timeout, std::optional<int> color) {
  const auto start = Clock::now();
  const Where w{"rendezvous", 0, -1, "", -1, start, start + timeout, seconds(timeout)};
  {
    std::lock_guard<std::mutex> g(call_lock());
    mpi::ensure_initialized_locked();
    group_index_ = mpi::register_group_locked();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (env.rank != rank_ || env.world_size != size_)
      throw ConfigError(lockstep::detail::concat(
          "mpi: the launch environment (", env.launcher, ") says rank ", env.rank, " of ",
          env.world_size, " but MPI_COMM_WORLD says rank ", rank_, " of ", size_,
          "; start the job with mpirun/srun alone, or pick another backend "
          "(LOCKSTEP_BACKEND=gloo|shm)"));
  }
  if (color && *color < 0)
    throw InvalidArgument(
        lockstep::detail::concat("mpi: a group's color must be >= 0, got ", *color));
  create_comms(w, color);
  exchange_pids(w);
}

void MpiBackend::create_comms(const Where& w, std::optional<int> color) {
  // Private communicators per backend: two groups never match each other's messages.
  // Duplicating is collective, so it waits for every rank's init(): nonblocking, so a
  // rank that never comes is a Rendezvous error, not a hang.
  auto idup = [&](MPI_Comm from, MPI_Comm* to) {
    try {
      run(w, "MPI_Comm_idup", [&](MPI_Request* r) { return MPI_Comm_idup(from, to, r); }, {});
    } catch (const CommError& e) {
      if (e.kind() != CommError::Kind::Timeout) throw;
      fail(CommError::Kind::Rendezvous, w,
           "not every rank of MPI_COMM_WORLD created its mpi group within the timeout");
    }
    std::lock_guard<std::mutex> g(call_lock());
    MPI_Comm_set_errhandler(*to, MPI_ERRORS_RETURN);
  };
  idup(MPI_COMM_WORLD, &comm_);
  if (color) {
    // MPI_Comm_split has no nonblocking form. It runs on the duplicate just made, whose
    // completion shows that every rank of the world has entered this constructor: the
    // split then waits only for ranks that are already on their way into it.
    const int world_rank = rank_;
    MPI_Comm world = comm_;
    {
      std::lock_guard<std::mutex> g(call_lock());
      comm_ = MPI_COMM_NULL;
      const int rc = MPI_Comm_split(world, *color, /*key=*/world_rank, &comm_);
      MPI_Comm_free(&world);
      check(rc, w, "MPI_Comm_split");
      MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
      MPI_Comm_rank(comm_, &rank_);
      MPI_Comm_size(comm_, &size_);
    }
  }
  idup(comm_, &ring_comm_);
}

void MpiBackend::exchange_pids(const Where& w) {
  constexpr int kBytes = 192;  // "<pid> <machine id>", NUL-padded
  std::vector<char> mine(kBytes, '\0'), all(static_cast<size_t>(kBytes) * size_, '\0');
  int world_rank = 0;
  {
    std::lock_guard<std::mutex> g(call_lock());
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  }
  const std::string me = lockstep::detail::concat(::getpid(), " ", world_rank, " ", machine_id());
  me.copy(mine.data(), std::min<size_t>(me.size(), kBytes - 1));
  run(w, "MPI_Iallgather",
      [&](MPI_Request* r) {
        return MPI_Iallgather(mine.data(), kBytes, MPI_CHAR, all.data(), kBytes, MPI_CHAR, comm_,
                              r);
      },
      {});
  std::vector<std::string> ids(size_);
  std::vector<pid_t> pids(size_, 0);
  std::vector<int> world(size_, -1);
  bool subgroup = false;
  for (int r = 0; r < size_; ++r) {
    std::istringstream in(std::string(all.data() + static_cast<size_t>(r) * kBytes));
    in >> pids[r] >> world[r] >> ids[r];
    subgroup = subgroup || world[r] != r;
  }
  if (subgroup) world_ranks_ = std::move(world);
  local_ = PeerWatch(rank_, ids, pids, kStoppedLimit);
}

int MpiBackend::dead_peer(Clock::time_point now, const Where& w, std::string* what) {
  if (now < next_live_) return -1;
  next_live_ = now + kLivenessEvery;
  const int dead = local_.empty() ? -1 : local_.check(what);
  if (dead < 0) return mpi::departed_member(group_index_, w.seq, w.start, world_ranks_, what);
  // In a subgroup, rank numbers are the group's: name the world rank too (mpirun's).
  if (dead >= 0 && !world_ranks_.empty())
    *what += lockstep::detail::concat(" [world rank ", world_ranks_[dead], "]");
  return dead;
}

MpiBackend::~MpiBackend() {
  std::lock_guard<std::mutex> g(call_lock());
  if (!mpi::is_finalized()) reap_abandoned_locked();
  if (!abandoned_.empty()) {
    // A collective's request may be neither freed nor cancelled (MPI 3.1, 5.12), and
    // the communicator must outlive it: leak both, and keep the buffers MPI may still
    // write alive. The group is broken anyway; MPI_Finalize reclaims the rest.
    for (auto& a : abandoned_) new std::vector<at::Tensor>(std::move(a.keep));
    return;
  }
  if (mpi::is_finalized()) return;
  for (MPI_Comm* c : {&comm_, &ring_comm_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

MpiBackend::Where MpiBackend::where(const OpContext& ctx, int peer) const {
  const bool has_data = ctx.desc.kind != OpKind::Barrier;
  return Where{op_kind_name(ctx.desc.kind),
               ctx.desc.seq,
               has_data ? ctx.desc.numel : -1,
               has_data ? dtype_name(ctx.desc.dtype) : std::string(),
               peer,
               ctx.start,
               ctx.deadline,
               seconds(ctx.timeout)};
}

void MpiBackend::fail(CommError::Kind kind, const Where& w, const std::string& msg) const {
  CommContext c;
  c.rank = rank_;
  c.world_size = size_;
  c.peer = w.peer;
  c.backend = "mpi";
  c.op = w.op;
  c.seq = w.seq;
  c.numel = w.numel;
  c.dtype = w.dtype;
  c.elapsed_s = seconds(Clock::now() - w.start);
  c.timeout_s = w.timeout_s;
  throw CommError(kind, std::move(c), msg);
}

void MpiBackend::check(int rc, const Where& w, const char* call) const {
  if (rc == MPI_SUCCESS) return;
  const bool truncated = mpi::error_class(rc) == MPI_ERR_TRUNCATE;
  fail(truncated ? CommError::Kind::Mismatch : CommError::Kind::Failed, w,
       lockstep::detail::concat(
           call, " failed: ", mpi::error_string(rc),
           truncated ? " (the peer sent more elements than this rank receives)" : ""));
}

void MpiBackend::reap_abandoned_locked() {
  for (size_t i = 0; i < abandoned_.size();) {
    int done = 0;
    MPI_Test(&abandoned_[i].req, &done, MPI_STATUS_IGNORE);
    if (done) {
      abandoned_[i] = std::move(abandoned_.back());
      abandoned_.pop_back();
    } else {
      ++i;
    }
  }
}

void MpiBackend::run(const Where& w, const char* call,
                     const std::function<int(MPI_Request*)>& start,
                     const std::vector<at::Tensor>& keep, bool cancellable, MPI_Status* status) {
  if (aborted_) fail(CommError::Kind::Aborted, w, "the group is being torn down (abort())");
  std::vector<MPI_Request> reqs{MPI_REQUEST_NULL};
  {
    std::lock_guard<std::mutex> g(call_lock());
    if (mpi::is_finalized()) fail(CommError::Kind::Failed, w, "MPI has been finalized");
    if (!abandoned_.empty()) reap_abandoned_locked();
    check(start(&reqs[0]), w, call);
  }
  await(w, call, reqs, 0, keep, cancellable, status);
}

void MpiBackend::await(const Where& w, const char* call, std::vector<MPI_Request>& reqs, size_t i,
                       const std::vector<at::Tensor>& keep, bool cancellable, MPI_Status* status) {
  MPI_Status local_status;
  MPI_Status* st = status ? status : &local_status;
  if (w.seq > 0) mpi::entered(group_index_, w.seq);
  Backoff backoff;
  for (;;) {
    int done = 0;
    int rc;
    {
      std::lock_guard<std::mutex> g(call_lock());
      if (mpi::is_finalized()) fail(CommError::Kind::Failed, w, "MPI has been finalized");
      rc = MPI_Test(&reqs[i], &done, st);
    }
    if (rc != MPI_SUCCESS) {
      // MPI_ERR_IN_STATUS does not apply to MPI_Test; the status may carry the detail.
      check(rc, w, call);
    }
    if (done) return;
    const bool aborted = aborted_.load();
    const auto now = Clock::now();
    std::string dead_what;
    const int dead = aborted ? -1 : dead_peer(now, w, &dead_what);
    if (aborted || dead >= 0 || now >= w.deadline) {
      {
        std::lock_guard<std::mutex> g(call_lock());
        for (MPI_Request& req : reqs) {
          if (req == MPI_REQUEST_NULL) continue;
          if (cancellable) MPI_Cancel(&req);
          int gone = 0;
          MPI_Test(&req, &gone, MPI_STATUS_IGNORE);
          if (!gone) abandoned_.push_back({req, keep});
        }
      }
      if (aborted) fail(CommError::Kind::Aborted, w, "the group is being torn down (abort())");
      if (dead >= 0) {
        mpi::note_broken(/*peer_gone=*/true);  // it will never reach MPI_Finalize
        Where at = w;
        at.peer = dead;
        fail(CommError::Kind::PeerGone, at, dead_what);
      }
      fail(CommError::Kind::Timeout, w,
           w.peer >= 0 ? lockstep::detail::concat("rank ", w.peer, " did not take part (", call,
                                                  " still pending)")
                       : lockstep::detail::concat("not every rank reached this ", w.op, " (", call,
                                                  " still pending)"));
    }
    backoff.pause();
  }
}

void MpiBackend::for_chunks(int64_t numel, const std::function<void(int64_t, int)>& fn) {
  const int64_t step = max_count();
  for (int64_t off = 0; off < numel; off += step)
    fn(off, static_cast<int>(std::min(step, numel - off)));
}

void MpiBackend::reject_large(int64_t n, const Where& w) const {
  if (n > max_count())
    fail(CommError::Kind::Failed, w,
         lockstep::detail::concat("mpi: ", n, " elements per rank exceed MPI's count limit of ",
                                  max_count(), " for ", w.op, "; split the tensor"));
}

void MpiBackend::allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) {
  const Where w = where(ctx, -1);
  const MPI_Datatype dt = mpi::datatype_for(t.scalar_type());  // both validate, whichever
  const MPI_Op mop = mpi::op_for(t.scalar_type(), op);         // path the tensor takes
  if (size_ > 1 && t.numel() * static_cast<int64_t>(t.element_size()) >= kRingMinBytes) {
    allreduce_ring(t, op, w);
    return;
  }
  char* base = static_cast<char*>(t.data_ptr());
  const int64_t esize = t.element_size();
  for_chunks(t.numel(), [&](int64_t off, int n) {
    run(w, "MPI_Iallreduce",
        [&](MPI_Request* r) {
          return MPI_Iallreduce(MPI_IN_PLACE, base + off * esize, n, dt, mop, comm_, r);
        },
        {t});
  });
}

void MpiBackend::broadcast(at::Tensor& t, int root, const OpContext& ctx) {
  const Where w = where(ctx, root);
  const MPI_Datatype dt = mpi::datatype_for(t.scalar_type());
  char* base = static_cast<char*>(t.data_ptr());
  const int64_t esize = t.element_size();
  for_chunks(t.numel(), [&](int64_t off, int n) {
    run(w, "MPI_Ibcast",
        [&](MPI_Request* r) { return MPI_Ibcast(base + off * esize, n, dt, root, comm_, r); }, {t});
  });
}

void MpiBackend::allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) {
  const Where w = where(ctx, -1);
  const int64_t n = in.numel();
  if (n == 0) return;  // every rank agrees (same descriptor): nothing to move
  reject_large(n, w);
  const MPI_Datatype dt = mpi::datatype_for(in.scalar_type());
  run(w, "MPI_Iallgather",
      [&](MPI_Request* r) {
        return MPI_Iallgather(in.data_ptr(), static_cast<int>(n), dt, out.data_ptr(),
                              static_cast<int>(n), dt, comm_, r);
      },
      {out, in});
}

void MpiBackend::reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                                const OpContext& ctx) {
  const Where w = where(ctx, -1);
  const int64_t n = out.numel();
  if (n == 0) return;
  reject_large(n, w);
  const MPI_Datatype dt = mpi::datatype_for(in.scalar_type());
  const MPI_Op mop = mpi::op_for(in.scalar_type(), op);
  run(w, "MPI_Ireduce_scatter_block",
      [&](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(n), dt,
                                         mop, comm_, r);
      },
      {out, in});
}

void MpiBackend::alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) {
  const Where w = where(ctx, -1);
  const int64_t n = in.numel() / size_;
  if (n == 0) return;
  reject_large(n, w);
  const MPI_Datatype dt = mpi::datatype_for(in.scalar_type());
  run(w, "MPI_Ialltoall",
      [&](MPI_Request* r) {
        return MPI_Ialltoall(in.data_ptr(), static_cast<int>(n), dt, out.data_ptr(),
                             static_cast<int>(n), dt, comm_, r);
      },
      {out, in});
}

// Empty tensors may have no storage; MPI wants a valid address even for 0 elements.
static char g_empty_byte;

void MpiBackend::send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) {
  const Where w = where(ctx, dst);
  const MPI_Datatype dt = mpi::datatype_for(t.scalar_type());
  char* base = t.numel() ? static_cast<char*>(t.data_ptr()) : &g_empty_byte;
  const int64_t esize = t.element_size();
  auto one = [&](int64_t off, int n) {
    run(
        w, "MPI_Isend",
        [&](MPI_Request* r) { return MPI_Isend(base + off * esize, n, dt, dst, tag, comm_, r); },
        {t}, /*cancellable=*/true);
  };
  if (t.numel() == 0)
    one(0, 0);  // the receiver expects a message
  else
    for_chunks(t.numel(), one);
}

void MpiBackend::recv(at::Tensor& t, int src, int tag, const OpContext& ctx) {
  const Where w = where(ctx, src);
  const MPI_Datatype dt = mpi::datatype_for(t.scalar_type());
  char* base = t.numel() ? static_cast<char*>(t.data_ptr()) : &g_empty_byte;
  const int64_t esize = t.element_size();
  int64_t received = 0;
  auto one = [&](int64_t off, int n) {
    MPI_Status st;
    run(
        w, "MPI_Irecv",
        [&](MPI_Request* r) { return MPI_Irecv(base + off * esize, n, dt, src, tag, comm_, r); },
        {t}, /*cancellable=*/true, &st);
    int got = 0;
    {
      std::lock_guard<std::mutex> g(call_lock());
      MPI_Get_count(&st, dt, &got);
    }
    received += got;
    if (got != n)
      fail(CommError::Kind::Mismatch, w,
           lockstep::detail::concat("rank ", src, " sent ", received, " elements (tag ", tag,
                                    ") but this rank expected ", t.numel()));
  };
  if (t.numel() == 0)
    one(0, 0);
  else
    for_chunks(t.numel(), one);
}

void MpiBackend::barrier(const OpContext& ctx) {
  const Where w = where(ctx, -1);
  run(w, "MPI_Ibarrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); }, {});
}

std::unique_ptr<Backend> make_mpi_backend(const LaunchEnv& env, Millis timeout,
                                          std::optional<int> color) {
  return std::make_unique<MpiBackend>(env, timeout, color);
}

bool mpi_available() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK")) return true;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);  // a program that started MPI itself (callable any time)
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace lockstep::comm
