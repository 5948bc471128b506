// The NCCL backend (docs/gpu.md): one GPU per rank (local_rank), one communicator, one
// communication stream from c10's pool.
//
// Every call obeys the Backend contract (synchronous, bounded by ctx.deadline): the
// communicator is non-blocking (ncclConfig_t::blocking = 0), so no NCCL call can hang the
// comm thread; the op is enqueued on the communication stream, an event is recorded after
// it, and the thread polls the event and ncclCommGetAsyncError until both say done. Past
// the deadline, on an NCCL error, or when abort() was called, the communicator is
// aborted (ncclCommAbort: kernels waiting for a dead peer are unblocked) and the op fails
// with a CommError naming the op, the rank and the elapsed time; the backend stays broken.
//
// Tensors: CUDA tensors of this rank's device are used in place (the caller must have
// made their producer's stream visible: StreamWork does, cuda_stream_work.h); CPU tensors
// (what ProcessGroup hands over today) are staged through device copies on the
// communication stream. send/recv: NCCL has no tags; messages between two ranks arrive in
// issue order, which the ProcessGroup's single comm thread keeps.
#include "comm/backend_factories.h"

#include <lockstep/error.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <thread>

namespace lockstep::comm {
namespace {

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kChar:
      return ncclInt8;
    default:
      return ncclUint8;  // kByte, kBool: a byte each
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
    default:
      return ncclSum;  // Avg: averages() is false, the group divides
  }
}

int device_for(const LaunchEnv& env) {
  int count = 0;
  const auto e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    throw ConfigError(lockstep::detail::concat("backend nccl needs a CUDA GPU per rank, but rank ",
                                               env.rank, " sees none (", cudaGetErrorString(e),
                                               "); use LOCKSTEP_BACKEND=shm or gloo on CPUs"));
  if (env.local_rank >= count)
    throw ConfigError(lockstep::detail::concat(
        "backend nccl: local rank ", env.local_rank, " needs GPU ", env.local_rank,
        " but this node has ", count, "; start at most ", count, " ranks per node"));
  return env.local_rank;
}

class NcclBackend final : public Backend {
 public:
  NcclBackend(const StorePtr& store, const std::string& prefix, const LaunchEnv& env,
              Millis timeout)
      : rank_(env.rank),
        size_(env.world_size),
        device_(device_for(env)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)) {
    c10::cuda::CUDAGuard guard(device_);
    OpContext ctx;
    ctx.desc.kind = OpKind::Barrier;
    ctx.start = Clock::now();
    ctx.deadline = ctx.start + timeout;
    ctx.timeout = timeout;
    ncclUniqueId id;
    const std::string key = prefix + "nccl/unique_id";
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), ctx, "ncclGetUniqueId");
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store->set(key, std::vector<uint8_t>(p, p + sizeof id));
    } else {
      const auto bytes = store->get(key);  // waits up to the store's timeout
      LOCKSTEP_CHECK(bytes.size() == sizeof id, "nccl unique id of ", bytes.size(), " bytes");
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), ctx, "ncclCommInitRankConfig");
    settle(ctx, "ncclCommInitRankConfig");
    scratch_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device_));
  }

  // A healthy communicator is finalized (bounded: a peer that is gone cannot hold the
  // destructor up for more than kFinalize), then destroyed; else aborted.
  ~NcclBackend() override {
    if (!comm_) return;  // aborted by raise()
    ncclResult_t st = ncclCommFinalize(comm_);
    const auto until = Clock::now() + kFinalize;
    while (st == ncclSuccess || st == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess || st == ncclSuccess) break;
      if (Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (st == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool bounded_by_deadline() const override { return true; }

  void allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) override {
    run_inout(t, ctx, [&](void* p, int64_t n) {
      return ncclAllReduce(p, p, size_t(n), nccl_type(t.scalar_type()), nccl_op(op), comm_, s());
    });
  }

  void broadcast(at::Tensor& t, int root, const OpContext& ctx) override {
    run_inout(t, ctx, [&](void* p, int64_t n) {
      return ncclBroadcast(p, p, size_t(n), nccl_type(t.scalar_type()), root, comm_, s());
    });
  }

  void allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override {
    run_in_out(out, in, ctx, [&](const void* i, void* o) {
      return ncclAllGather(i, o, size_t(in.numel()), nccl_type(in.scalar_type()), comm_, s());
    });
  }

  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                      const OpContext& ctx) override {
    run_in_out(out, in, ctx, [&](const void* i, void* o) {
      return ncclReduceScatter(i, o, size_t(out.numel()), nccl_type(in.scalar_type()), nccl_op(op),
                               comm_, s());
    });
  }

  // Grouped send/recv: slice r of `in` to rank r, slice r of `out` from rank r.
  void alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override {
    const int64_t n = in.numel() / size_;
    const size_t bytes = size_t(n) * in.element_size();
    const auto dt = nccl_type(in.scalar_type());
    run_in_out(out, in, ctx, [&](const void* i, void* o) {
      ncclResult_t r = ncclGroupStart();
      for (int peer = 0; peer < size_ && r == ncclSuccess; ++peer) {
        r = ncclSend(static_cast<const char*>(i) + peer * bytes, size_t(n), dt, peer, comm_, s());
        if (r == ncclSuccess || r == ncclInProgress)
          r = ncclRecv(static_cast<char*>(o) + peer * bytes, size_t(n), dt, peer, comm_, s());
      }
      const ncclResult_t e = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? e : r;
    });
  }

  void send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) override {
    at::Tensor src = t;  // only read: no copy back into a staged CPU tensor
    run_inout(
        src, ctx,
        [&](void* p, int64_t n) {
          return ncclSend(p, size_t(n), nccl_type(t.scalar_type()), dst, comm_, s());
        },
        /*write_back=*/false);
  }

  void recv(at::Tensor& t, int src, int tag, const OpContext& ctx) override {
    run_inout(t, ctx, [&](void* p, int64_t n) {
      return ncclRecv(p, size_t(n), nccl_type(t.scalar_type()), src, comm_, s());
    });
  }

  // An allreduce of one int on the GPU: every rank has entered once it completes.
  void barrier(const OpContext& ctx) override {
    run_inout(scratch_, ctx, [&](void* p, int64_t) {
      return ncclAllReduce(p, p, 1, ncclInt32, ncclSum, comm_, s());
    });
  }

  bool takes_device_tensors() const override { return true; }
  void abort() noexcept override { aborted_ = true; }

 private:
  cudaStream_t s() const { return stream_.stream(); }

  // The device tensor an op works on: `t` itself if it is on this rank's GPU, else a copy
  // queued on the communication stream.
  at::Tensor on_device(const at::Tensor& t) const {
    if (t.is_cuda() && t.get_device() == device_) return t;
    return t.to(at::TensorOptions().device(at::kCUDA, device_), /*non_blocking=*/false, true);
  }

  template <typename F>
  void run_inout(at::Tensor& t, const OpContext& ctx, F&& f, bool write_back = true) {
    if (t.numel() == 0) return;
    c10::cuda::CUDAStreamGuard guard(stream_);  // staging copies go on the comm stream
    at::Tensor d = on_device(t);
    issue(ctx, [&] { return f(d.data_ptr(), d.numel()); });
    if (write_back && !d.is_same(t)) t.copy_(d);
  }

  template <typename F>
  void run_in_out(at::Tensor& out, const at::Tensor& in, const OpContext& ctx, F&& f) {
    if (in.numel() == 0 || out.numel() == 0) return;
    c10::cuda::CUDAStreamGuard guard(stream_);
    const at::Tensor di = on_device(in);
    at::Tensor d_out = on_device(out);
    issue(ctx, [&] { return f(di.data_ptr(), d_out.data_ptr()); });
    if (!d_out.is_same(out)) out.copy_(d_out);
  }

  // Enqueues one op and polls it to the end, within ctx.deadline.
  template <typename F>
  void issue(const OpContext& ctx, F&& enqueue) {
    if (broken_)
      raise(ctx, CommError::Kind::Aborted, "the communicator was aborted by an earlier error");
    const char* what = op_kind_name(ctx.desc.kind);
    check(enqueue(), ctx, what);
    settle(ctx, what);  // non-blocking mode: the op may still be being enqueued
    cudaEvent_t ev = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), ctx);
    const auto rec = cudaEventRecord(ev, s());
    if (rec != cudaSuccess) cudaEventDestroy(ev);
    check_cuda(rec, ctx);
    for (;;) {
      const auto q = cudaEventQuery(ev);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        cudaEventDestroy(ev);
        check_cuda(q, ctx);
      }
      try {
        poll_once(ctx, what);
      } catch (...) {
        cudaEventDestroy(ev);
        throw;
      }
    }
    cudaEventDestroy(ev);
  }

  // Waits until the communicator has no call in progress (non-blocking mode).
  void settle(const OpContext& ctx, const char* what) {
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclCommGetAsyncError(comm_, &st);
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) check(st, ctx, what);
      poll_once(ctx, what);
    }
  }

  // One polling step: fails on an asynchronous NCCL error, abort() or the deadline.
  void poll_once(const OpContext& ctx, const char* what) {
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(comm_, &st);
    if (st != ncclSuccess && st != ncclInProgress) check(st, ctx, what);
    if (aborted_) raise(ctx, CommError::Kind::Aborted, "the group is being torn down");
    if (Clock::now() >= ctx.deadline)
      raise(ctx, CommError::Kind::Timeout,
            "the NCCL operation did not complete in time (a rank did not take part, or its GPU "
            "is stuck); the communicator was aborted");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

  void check(ncclResult_t r, const OpContext& ctx, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const auto kind = r == ncclRemoteError || r == ncclSystemError ? CommError::Kind::PeerGone
                                                                   : CommError::Kind::Failed;
    const char* last = comm_ ? ncclGetLastError(comm_) : "";
    raise(ctx, kind,
          lockstep::detail::concat(what, ": ", ncclGetErrorString(r), (last && *last ? "; " : ""),
                                   last ? last : ""));
  }

  void check_cuda(cudaError_t e, const OpContext& ctx) {
    if (e != cudaSuccess)
      raise(ctx, CommError::Kind::Failed,
            lockstep::detail::concat("CUDA: ", cudaGetErrorString(e)));
  }

  // Aborts the communicator (once) and throws: every later op fails at once.
  [[noreturn]] void raise(const OpContext& ctx, CommError::Kind kind, const std::string& msg) {
    if (comm_ && !broken_.exchange(true)) ncclCommAbort(comm_), comm_ = nullptr;
    throw CommError(kind, op_context(*this, ctx.desc, &ctx), msg);
  }

  static constexpr Millis kFinalize{10000};

  const int rank_, size_, device_;
  const c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
  at::Tensor scratch_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, Millis timeout) {
  return std::make_unique<NcclBackend>(store, prefix, env, timeout);
}

bool nccl_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace lockstep::comm
