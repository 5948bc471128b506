// python/src/backend.h: lockstep's ProcessGroup as a c10d::Backend (torch.distributed's
// "lockstep" backend; docs/python.md).
//
// Every c10d call is validated and queued on lockstep's group (which runs ops in issue
// order on its comm thread); the returned c10d::Work completes, and its Future is marked,
// from one completion thread per backend, in issue order. Tensors lockstep cannot take
// as they are (non-contiguous, lists of outputs) are staged through a contiguous buffer
// and copied back before the Work completes.
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/compress/compressed_allreduce.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::python {

// A queued lockstep op seen as c10d::Work. `post` (copies out of staging buffers) runs
// once, after the lockstep op succeeded, before the Work counts as completed.
class LockstepWork : public c10d::Work {
 public:
  LockstepWork(int rank, c10d::OpType type, std::vector<comm::WorkPtr> works,
               std::vector<at::Tensor> outputs, std::function<void()> post);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  // Called by the completion thread: waits for lockstep's op, runs `post`, completes.
  void complete();

 private:
  std::vector<comm::WorkPtr> works_;  // all must succeed, in this order
  std::vector<at::Tensor> outputs_;
  std::function<void()> post_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class LockstepBackend : public c10d::Backend {
 public:
  // `transport`: "shm" (all ranks on one node) or "gloo". Rendezvous through `store`
  // (torch's, already prefixed per group).
  LockstepBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout, const std::string& transport);
  ~LockstepBackend() override;
  // Drains the completion queue, joins its thread and closes lockstep's group (without the
  // GIL); later ops throw CommError.
  // Idempotent. Python calls it at interpreter exit (a thread that needs the GIL during
  // interpreter finalization is killed, which aborts the process).
  void shutdown() override;

  const std::string getBackendName() const override { return "lockstep"; }
  std::string transport() { return group().backend_name(); }
  double timeout_s() { return static_cast<double>(group().options().timeout.count()) / 1000.0; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  c10::intrusive_ptr<c10d::Work> track(c10d::OpType type, std::vector<comm::WorkPtr> works,
                                       std::vector<at::Tensor> outputs,
                                       std::function<void()> post = {});
  c10::intrusive_ptr<c10d::Work> track(c10d::OpType type, comm::WorkPtr work,
                                       std::vector<at::Tensor> outputs,
                                       std::function<void()> post = {}) {
    return track(type, std::vector<comm::WorkPtr>{std::move(work)}, std::move(outputs),
                 std::move(post));
  }
  // The QSGD-compressed allreduce of `t` when compression is on and applies to it (float
  // dtype, SUM or AVG, at least min_layer elements); null otherwise.
  c10::intrusive_ptr<c10d::Work> maybe_compressed(at::Tensor& t, comm::ReduceOp op);
  void completion_loop();
  void stop_completer();
  comm::ProcessGroup& group();  // CommError after shutdown()

  c10::intrusive_ptr<c10d::Store> store_;  // lockstep's shm/gloo rendezvous keys live here
  std::shared_ptr<comm::ProcessGroup> group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<LockstepWork>> pending_;
  bool stopping_ = false;
  std::thread completer_;
  std::mutex join_mu_;  // shutdown() and the destructor may both join
  // One plan per buffer size (DDP's buckets keep their sizes from step to step).
  // Cleared when the options change (plans_for_).
  std::mutex plans_mu_;
  std::shared_ptr<const compress::QsgdOptions> plans_for_;
  std::map<int64_t, std::shared_ptr<compress::CompressedAllreduce>> plans_;
};

// Compression of the float allreduces of every lockstep backend of this process
// (lockstep.compression(); docs/python.md). Null: off. Every rank must set the same.
void set_compression(std::shared_ptr<const compress::QsgdOptions> options);
std::shared_ptr<const compress::QsgdOptions> compression();

}  // namespace lockstep::python
