// lockstep/comm/cuda_stream_work.h: the stream contract of a collective on CUDA tensors
// (c10d's NCCL contract; docs/gpu.md).
//
//  1. Issue: an event `ready` is recorded on the caller's current stream and the
//     communication stream waits for it, so the op sees everything queued before it.
//  2. The op is enqueued on the communication stream, then an event `done` after it.
//  3. wait() makes the caller's stream (or any stream) wait for `done`: work queued there
//     afterwards sees the result. The host does not block.
//  4. The tensors stay referenced until `done` is known to have passed (is_completed(),
//     synchronize()), or, when the StreamWork is dropped earlier, until the StreamOps
//     sees `done` pass (release_after): the caching allocator cannot hand their memory to
//     another tensor while the communication stream still reads or writes it.
//  5. An error while enqueuing (an NCCL call failing, a launch failing) is kept and
//     rethrown by wait(), is_completed() and synchronize(), on whichever thread calls.
//
// The CUDA calls sit behind StreamOps, so the ordering and lifetime logic above is plain
// C++ and is unit-tested without a GPU (tests/unit/test_cuda_stream_work.cpp, with a fake
// StreamOps that records the calls); cuda_stream_ops() is the real one (CUDA builds).
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace lockstep::comm::cuda {

using Stream = void*;  // a cudaStream_t
using Event = void*;   // a cudaEvent_t

// The CUDA operations the contract uses. Thread-safe.
class StreamOps {
 public:
  virtual ~StreamOps() = default;
  // The calling thread's current stream (c10::cuda::getCurrentCUDAStream).
  virtual Stream current_stream() = 0;
  // A new event, recorded on `s` (cudaEventCreateWithFlags(DisableTiming) + cudaEventRecord).
  virtual Event record(Stream s) = 0;
  // `s` waits for `e` (cudaStreamWaitEvent): no host blocking.
  virtual void wait(Stream s, Event e) = 0;
  // True once everything before `e` has run (cudaEventQuery).
  virtual bool query(Event e) = 0;
  // Blocks the host until `e` has passed (cudaEventSynchronize).
  virtual void synchronize(Event e) = 0;
  virtual void destroy(Event e) noexcept = 0;
  // Keeps `tensors` referenced until `e` has passed, then destroys `e` and drops them
  // (checked whenever the ops are used again, and at the latest at the ops' destruction).
  virtual void release_after(Event e, std::vector<at::Tensor> tensors) noexcept = 0;
};

// The StreamOps of the CUDA runtime. Throws ConfigError in a build without CUDA.
std::shared_ptr<StreamOps> cuda_stream_ops();

class StreamWork {
 public:
  // Step 1: `ready` on caller_stream, comm_stream waits for it. Holds `tensors`.
  StreamWork(std::shared_ptr<StreamOps> ops, Stream caller_stream, Stream comm_stream,
             std::vector<at::Tensor> tensors);
  ~StreamWork();
  StreamWork(const StreamWork&) = delete;
  StreamWork& operator=(const StreamWork&) = delete;

  // Step 2: runs `enqueue` (which queues the op on the communication stream), then
  // records `done` on it. Called once. An exception from `enqueue` is kept (see 5), and
  // `done` is still recorded, so waiting never hangs on an op that was never queued.
  void enqueue(const std::function<void()>& enqueue);
  // Step 3 on `stream` (nullptr: the calling thread's current stream). Rethrows an error.
  void wait(Stream stream = nullptr);
  // True once `done` has passed (then the tensors are dropped). Rethrows an error.
  bool is_completed();
  // Blocks the host until `done` has passed. Rethrows an error.
  void synchronize();

  Stream comm_stream() const { return comm_; }
  // The tensors still referenced (empty once the op is known to have finished).
  size_t tensors_held() const;

 private:
  void rethrow_locked() const;
  void release_locked();

  const std::shared_ptr<StreamOps> ops_;
  const Stream comm_;
  mutable std::mutex mu_;
  Event ready_ = nullptr;
  Event done_ = nullptr;
  bool finished_ = false;  // `done` observed to have passed
  std::exception_ptr error_;
  std::vector<at::Tensor> tensors_;
};

}  // namespace lockstep::comm::cuda
