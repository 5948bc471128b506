// lockstep/comm/process_group.h: the group of ranks and its collectives.
//
// A ProcessGroup owns one Backend and one communication thread. Every operation
// is validated on the caller's thread (CPU or CUDA, contiguous, supported dtype, sizes),
// numbered, and queued; the comm thread runs them in issue order and completes
// the returned Work. Ranks must issue the same collectives in the same order
// (as with every MPI-style library); when they do not, the group detects it
// (different op, size, dtype or root for the same sequence number) and raises
// CommError(Mismatch) on every rank, naming both ranks' ops, instead of corrupting data.
// While a collective waits for ranks that have not entered it, rank 0 names them and
// what each last entered, every stall_warn seconds (docs/debugging.md).
//
// CUDA tensors (one device per op) go to nccl as they are and through pinned host memory
// to the other backends, ordered with the caller's current stream: wait() makes the
// waiter's stream wait for the result without blocking the host (docs/gpu.md).
//
// After the first failure (peer gone, timeout, mismatch) the group is broken:
// queued and later operations fail at once with the original cause.
//
// Thread safety: operations may be issued from any thread; issue order is the
// order in which calls acquire the group's lock. Two groups never share state.
#pragma once

#include <lockstep/comm/backend.h>
#include <lockstep/comm/types.h>
#include <lockstep/comm/work.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace lockstep::comm {

class StoreChannel;    // internal: src/comm/store_channel.h
class DeviceStaging;   // internal: src/comm/device_staging.h
class StallInspector;  // internal: src/comm/stall_inspector.h
struct RankActivity;   // internal: src/comm/stall_inspector.h

struct ProcessGroupOptions {
  // Default timeout of every op (LOCKSTEP_TIMEOUT_S overrides it in init()).
  Millis timeout{std::chrono::seconds(300)};
  // Compare each collective's fingerprint (op, seq, count, dtype, reduce op, root) across
  // ranks before running it. Free on shm (always on there); one small allgather per op on
  // gloo/mpi (LOCKSTEP_CHECK_COLLECTIVES=0 turns it off).
  bool check_collectives = true;
  // LOCKSTEP_DEBUG=DETAIL: check every collective whatever check_collectives says, through
  // the rendezvous store where the group has `side_store` (gloo), else by the allgather.
  bool detail = false;
  // LOCKSTEP_STALL_WARN_S: once a collective has waited this long for ranks that have not
  // entered it, rank 0 prints them and what each last entered, and repeats at this
  // interval (docs/debugging.md). 0 = never.
  Millis stall_warn{std::chrono::seconds(60)};
  // Set by init() on backends without shared memory (gloo): the group's keys in the
  // rendezvous store, over a connection of their own. Null: none (then DETAIL checks by
  // allgather and the stall inspector shows this rank's own view only).
  std::shared_ptr<StoreChannel> side_store;
};

class ProcessGroup {
 public:
  ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options = {});
  // Finishes queued work, then stops the comm thread; aborts the backend instead of
  // waiting on an op stuck past its deadline or on a broken group.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string backend_name() const { return backend_->name(); }
  const ProcessGroupOptions& options() const { return options_; }

  // In place: t <- op over ranks.
  WorkPtr allreduce(at::Tensor& t, const AllreduceOptions& o = {});
  // In place, one collective over the tensors seen as one flat array (list order): each
  // t <- op over ranks. Same dtype for all; every rank passes the same total size. For
  // many small or scattered tensors (e.g. DDP gradients) without a flattening copy where
  // the backend allows (shm); others flatten into a temporary.
  WorkPtr allreduce_coalesced(std::vector<at::Tensor> ts, const AllreduceOptions& o = {});
  // In place: t <- root's t.
  WorkPtr broadcast(at::Tensor& t, const BroadcastOptions& o = {});
  // out.numel() == size() * in.numel(); rank r's input lands at [r*n, (r+1)*n).
  WorkPtr allgather(at::Tensor& out, const at::Tensor& in, const AllgatherOptions& o = {});
  // in.numel() == size() * out.numel(); out <- op over ranks of their slice [rank*n, (rank+1)*n).
  WorkPtr reduce_scatter(at::Tensor& out, const at::Tensor& in, const ReduceScatterOptions& o = {});
  // in.numel() == out.numel() == size() * n; out slice r <- rank r's in slice rank().
  WorkPtr alltoall(at::Tensor& out, const at::Tensor& in, const AlltoallOptions& o = {});
  // Point to point; messages between a pair arrive in order and tags must match.
  WorkPtr send(const at::Tensor& t, int dst, const SendOptions& o = {});
  WorkPtr recv(at::Tensor& t, int src, const RecvOptions& o = {});
  WorkPtr barrier(const BarrierOptions& o = {});

  // Collective (blocks until done): `numel` elements of `dtype` in memory that every rank
  // of the group maps (shm). An allreduce of one tensor that lies at the same place of
  // such memory on every rank reads and writes the peers' data where it lies, without
  // staging copies (DDP puts its buckets there). Undefined on a single rank, on backends
  // whose ranks share no memory (gloo, mpi), or when /dev/shm cannot hold it (the ranks
  // that failed warn why), on every rank alike: callers fall back to ordinary memory.
  // A broken group throws its CommError, as every collective does.
  at::Tensor alloc_shared(int64_t numel, at::ScalarType dtype);

  // A collective composed of several backend calls (e.g. the compressed allreduce:
  // alltoall, local work, allgather). `body` runs on the comm thread as ONE operation:
  // one sequence number, one descriptor check of (numel, dtype), and its steps stay in
  // the same order on every rank however callers' threads interleave. Each step calls
  // the backend directly with step_context(ctx, ...). Every rank must pass the same
  // numel and dtype.
  // `fingerprint` summarizes the body's parameters (e.g. compression options): ranks that
  // pass different fingerprints get CommError(Mismatch) instead of mismatched steps.
  WorkPtr run_composite(int64_t numel, at::ScalarType dtype,
                        std::function<void(Backend&, const OpContext&)> body,
                        Millis timeout = Millis(0), int64_t fingerprint = 0);
  // run_composite over one tensor that `body` reads and writes (numel and dtype are its).
  // A CUDA tensor reaches `body` as a pinned host twin, copied in and out around it and
  // ordered with the caller's stream as the collectives' are, on every backend (composite
  // bodies compute on the host).
  WorkPtr run_composite_on(at::Tensor& t,
                           std::function<void(Backend&, const OpContext&, at::Tensor&)> body,
                           Millis timeout = Millis(0), int64_t fingerprint = 0);

  // Breaks the group on purpose: queued and later ops fail with `why`, and the backend
  // is told to wake anything blocked (shm also tells the peers, so they raise promptly
  // instead of waiting out their timeout). For callers that leave the collective
  // sequence out of step with the peers (e.g. a backward that failed half-way).
  void abort(std::exception_ptr why);
  bool broken() const;

  // The backend, for code that needs transport-specific calls. Not thread-safe.
  Backend& backend() { return *backend_; }

 private:
  struct Task {
    WorkPtr work;
    OpDesc desc;
    Millis timeout;
    std::function<void(const OpContext&)> run;
    // Queued without waking the comm thread (a small op on a deadline-bounded backend:
    // its waiter will likely run it, see enqueue()); the comm thread takes it only
    // once it has waited a while, or another op queues behind it.
    bool deferred = false;
    Clock::time_point queued_at{};
  };
  WorkPtr enqueue(OpDesc desc, Millis timeout, std::function<void(const OpContext&)> run,
                  std::function<void()> on_wait = {});
  // An op whose tensors went through `staging` (CUDA tensors: docs/gpu.md).
  WorkPtr enqueue(OpDesc desc, Millis timeout, DeviceStaging& staging,
                  std::function<void(const OpContext&)> run);
  void comm_loop();
  // Whether the comm thread should take the queue's front now (see Task::deferred).
  bool front_ready_locked(Clock::time_point now) const;
  void run_task(Task& task);
  // Runs `w` on the calling thread if it is next in the queue and the comm thread is
  // idle (Work::wait's fast path: no hand-off to the comm thread and back).
  void run_here(Work& w);
  void check_descriptor(const OpContext& ctx);
  void check_through_store(const OpContext& ctx);
  // Collectives only: this rank's last one, for the stall inspector.
  void entered_locked(const OpDesc& d, Clock::time_point now);
  RankActivity activity() const;
  void start_inspector();
  Millis resolve(Millis t) const { return t.count() > 0 ? t : options_.timeout; }
  CommContext context_for(const OpDesc& d) const;

  std::unique_ptr<Backend> backend_;
  const ProcessGroupOptions options_;
  const int rank_;
  const int size_;

  void fail_locked(std::exception_ptr err);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool exited_ = false;               // the comm thread has left its loop
  bool running_ = false;              // the comm thread has a task in the backend
  bool running_here_ = false;         // a waiting thread has one (run_here)
  bool polling_ = false;              // the comm thread sleeps with a timeout: no wake needed
  Clock::time_point active_until_{};  // the comm thread polls until then (recent ops)
  std::thread::id here_thread_;       // ... and this is that thread
  Clock::time_point running_deadline_;
  uint64_t next_seq_ = 1;                 // collectives
  std::exception_ptr broken_;             // first failure; later ops fail with it
  std::atomic<bool> broken_flag_{false};  // == (broken_ != nullptr), read without mu_
  OpDesc last_entered_;                   // the last collective this rank entered (seq 0: none)
  Clock::time_point entered_at_;          // ... when
  bool in_collective_ = false;            // ... and whether it is still running
  std::thread thread_;
  // Lets Work handles break this group after a timeout, even if they outlive it.
  struct Link {
    std::mutex mu;
    ProcessGroup* group = nullptr;
  };
  std::shared_ptr<Link> link_ = std::make_shared<Link>();
  std::shared_ptr<Link> inspector_link_ = std::make_shared<Link>();  // never held during an op
  std::unique_ptr<StallInspector> inspector_;
};

}  // namespace lockstep::comm
