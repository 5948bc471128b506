// Internal: the MPI backend's class, shared by its per-algorithm files.
//
// Every op is MPI's nonblocking variant (or nonblocking point-to-point messages) polled
// with MPI_Test, so an op can give up at its deadline (CommError::Timeout) or when the
// group aborts (Kind::Aborted): blocking MPI calls cannot be interrupted.
#pragma once

#include "comm/backend_factories.h"
#include "comm/backends/mpi/mpi_runtime.h"
#include "comm/peer_watch.h"

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::comm {

class MpiBackend final : public Backend {
 public:
  // color: nullopt for the whole of MPI_COMM_WORLD; else the ranks of the world that pass
  // the same color (>= 0), ordered by world rank (MPI_Comm_split with key = world rank).
  // Collective over MPI_COMM_WORLD either way.
  MpiBackend(const LaunchEnv& env, Millis timeout, std::optional<int> color = std::nullopt);
  ~MpiBackend() override;

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool bounded_by_deadline() const override { return true; }  // nonblocking calls, polled

  void allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) override;
  // Tensors of at least this many bytes take the ring over point-to-point messages
  // (allreduce_ring_mpi.cpp); smaller ones MPI_Iallreduce.
  static constexpr int64_t kRingMinBytes = 256 << 10;
  void broadcast(at::Tensor& t, int root, const OpContext& ctx) override;
  void allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override;
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                      const OpContext& ctx) override;
  void alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override;
  void send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) override;
  void recv(at::Tensor& t, int src, int tag, const OpContext& ctx) override;
  void barrier(const OpContext& ctx) override;
  // Also marks the process (mpi::note_broken): at exit, MPI_Abort instead of a blocking
  // MPI_Finalize if it exits non-zero.
  void abort() noexcept override {
    aborted_ = true;
    mpi::note_broken(false);
  }

 private:
  // What an error message needs to know about the op in flight.
  struct Where {
    const char* op;
    uint64_t seq;
    int64_t numel;
    std::string dtype;
    int peer;
    Clock::time_point start, deadline;
    double timeout_s;
  };
  Where where(const OpContext& ctx, int peer) const;
  [[noreturn]] void fail(CommError::Kind kind, const Where& w, const std::string& msg) const;
  void check(int rc, const Where& w, const char* call) const;

  // Issues one nonblocking call (under call_lock) and polls it to completion.
  void run(const Where& w, const char* call, const std::function<int(MPI_Request*)>& start,
           const std::vector<at::Tensor>& keep, bool cancellable = false,
           MPI_Status* status = nullptr);
  // Polls until reqs[i] completes (each MPI_Test also progresses the others). At the
  // deadline or on abort, every request of reqs still pending is cancelled (cancellable)
  // or abandoned together with `keep`, the buffers MPI may still write.
  void await(const Where& w, const char* call, std::vector<MPI_Request>& reqs, size_t i,
             const std::vector<at::Tensor>& keep, bool cancellable = false,
             MPI_Status* status = nullptr);
  // Reduce-scatter + allgather around the ring of ranks on ring_comm_.
  void allreduce_ring(at::Tensor& t, ReduceOp op, const Where& w);
  // Chunks [0, numel) into pieces of at most max_count() elements.
  static void for_chunks(int64_t numel, const std::function<void(int64_t, int)>& fn);
  void reject_large(int64_t n, const Where& w) const;
  void reap_abandoned_locked();
  // Builds comm_ (the world's duplicate, or its split by color) and ring_comm_.
  void create_comms(const Where& w, std::optional<int> color);
  // Publishes every rank's pid, machine and world rank (one MPI_Iallgather) for local_.
  void exchange_pids(const Where& w);
  // A same-machine peer that exited or stayed stopped, or a member that left the job
  // without taking part in op `w` (mpi_departure.h): its rank and *what, else -1.
  // Rate-limited: checks at most every kLivenessEvery.
  int dead_peer(Clock::time_point now, const Where& w, std::string* what);

  int rank_ = 0;  // in comm_
  int size_ = 1;
  std::vector<int> world_ranks_;  // of comm_'s ranks, when comm_ is a subgroup of the world
  MPI_Comm comm_ = MPI_COMM_NULL;
  // The ring's messages travel apart from send/recv's, which may carry any tag.
  MPI_Comm ring_comm_ = MPI_COMM_NULL;
  std::atomic<bool> aborted_{false};
  struct Abandoned {
    MPI_Request req;
    std::vector<at::Tensor> keep;  // buffers MPI may still write
  };
  std::vector<Abandoned> abandoned_;  // comm thread only
  // Peers on this machine, watched by pid while an op waits: MPI itself reports a dead
  // peer late or never (OpenMPI's vader BTL waits forever; mpirun kills the job, but a
  // stopped rank is never reported). Remote peers: mpirun aborts the job when one dies.
  static constexpr Millis kLivenessEvery{20};
  static constexpr Millis kStoppedLimit{3000};
  PeerWatch local_;
  Clock::time_point next_live_{};
  int group_index_ = -1;  // for departure notices (mpi_departure.h); -1: none
};

}  // namespace lockstep::comm
