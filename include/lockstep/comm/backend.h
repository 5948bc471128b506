// lockstep/comm/backend.h: the contract a transport implements (shm, gloo, mpi, ...).
//
// A Backend is synchronous and single-threaded by contract: the owning ProcessGroup
// calls it from its one communication thread, in issue order, which is the same
// order on every rank. Each call blocks until this rank's part is done, and must
// give up with a CommError (or any exception; the group adds context) once
// `ctx.deadline` passes or a peer is known to be gone. Tensors arrive validated:
// CPU, contiguous, supported dtype, sizes consistent with the op. ReduceOp::Avg
// reaches allreduce only if the backend says averages() (else the group sums and
// divides); allreduce_coalesced always gets it (the default divides on its way back).
#pragma once

#include <lockstep/comm/types.h>
#include <lockstep/error.h>

#include <string>
#include <vector>

namespace lockstep::comm {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // True if the backend itself compares each collective's OpDesc across ranks
  // (so the group need not spend a round trip on it). Mismatch -> CommError::Mismatch.
  virtual bool checks_descriptors() const { return false; }
  // True if allreduce / allreduce_coalesced accept ReduceOp::Avg themselves (dividing
  // in the pass that reduces, instead of a separate pass over the result).
  virtual bool averages() const { return false; }
  // True if every call returns by its ctx.deadline (plus a little) whatever the peers
  // do: the group may then run an op on the thread that waits for it (Work::wait's fast
  // path). A backend that may block past its deadline keeps every op on the comm thread,
  // where Work::wait can still give up on it.
  virtual bool bounded_by_deadline() const { return false; }

  // t <- op over ranks of t.
  virtual void allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) = 0;
  // The tensors (one dtype), seen as one flat array in list order, <- op over ranks: one
  // collective, as allreduce of their concatenation (the descriptor says so too). The
  // default flattens into a buffer the calling thread keeps for its next call (as large
  // as the largest list so far), calls allreduce, and copies back (dividing in that
  // pass for Avg); a backend that reads and writes the tensors in place (shm)
  // saves the two copies. Takes Avg whatever averages() says.
  virtual void allreduce_coalesced(std::vector<at::Tensor>& ts, ReduceOp op, const OpContext& ctx);
  // t <- root's t.
  virtual void broadcast(at::Tensor& t, int root, const OpContext& ctx) = 0;
  // out (P*n elements) <- concat over ranks r of in_r (n elements), in rank order.
  virtual void allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) = 0;
  // in has P*n elements; out (n elements) <- op over ranks r of in_r[rank*n, (rank+1)*n).
  virtual void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                              const OpContext& ctx) = 0;
  // in, out have P*n elements; out[r*n, (r+1)*n) <- in_r[rank*n, (rank+1)*n).
  virtual void alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) = 0;
  // Point to point. May block until the peer receives (as MPI_Send may).
  virtual void send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) = 0;
  virtual void recv(at::Tensor& t, int src, int tag, const OpContext& ctx) = 0;
  virtual void barrier(const OpContext& ctx) = 0;

  // True if the ranks can map each other's memory (one node: shm).
  virtual bool shares_memory() const { return false; }
  // Whether the backend works on CUDA tensors where they lie (nccl). Else ProcessGroup
  // stages them through pinned host memory (src/comm/device_staging.h).
  virtual bool takes_device_tensors() const { return false; }
  // Collective, only where shares_memory(): `numel` elements of `dtype` in memory every
  // rank maps; collectives over tensors that lie at the same place of such memory on
  // every rank may skip their staging copies. Undefined if the memory could not be had
  // (on every rank alike).
  virtual at::Tensor alloc_shared(int64_t numel, at::ScalarType dtype, const OpContext& ctx) {
    (void)numel, (void)dtype, (void)ctx;
    return {};
  }

  // Two-level backends (hier): the group of this rank's node and the cross-node group of its
  // local rank, for algorithms composed above the backend (the compressed allreduce that
  // quantizes only what crosses nodes). Both null elsewhere. Their errors carry the inner
  // groups' rank numbers.
  struct Levels {
    Backend* node = nullptr;
    Backend* across = nullptr;
  };
  virtual Levels levels() { return {}; }

  // The last collective each rank has entered, where the transport shows it without any
  // communication (shm: the descriptors every rank posts in the segment), indexed by rank
  // (seq 0: none yet); empty where it does not. For the stall inspector: called from its
  // thread while ops run, so it must be thread-safe and cheap, and never throw. What it
  // returns for this rank itself is not used (the group knows better).
  virtual std::vector<OpDesc> last_entered() const { return {}; }

  // Called once from another thread when the group is being torn down after an
  // error or timeout: wake anything blocked so the comm thread can exit. Must be
  // async-signal-agnostic and never throw.
  virtual void abort() noexcept {}
};

// The CommContext of op `d` on backend `b` (rank, world, backend, op, seq, size, dtype,
// peer), plus elapsed and timeout when `timing` is given: what every error reports.
CommContext op_context(const Backend& b, const OpDesc& d, const OpContext* timing = nullptr);

}  // namespace lockstep::comm
