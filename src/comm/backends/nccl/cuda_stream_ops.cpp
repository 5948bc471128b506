// The CUDA runtime's StreamOps (cuda_stream_work.h): events without timing, the caller's
// current stream from c10, and a list of (event, tensors) released once the event passed.
#include <lockstep/comm/cuda_stream_work.h>
#include <lockstep/error.h>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <list>
#include <utility>

namespace lockstep::comm::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(lockstep::detail::concat("CUDA ", what, " failed: ", cudaGetErrorString(e)));
}

class CudaStreamOps final : public StreamOps {
 public:
  ~CudaStreamOps() override {
    // Whatever is still pending: its stream must finish before its tensors go.
    for (auto& p : pending_) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(p.first));
      cudaEventDestroy(static_cast<cudaEvent_t>(p.first));
    }
  }

  Stream current_stream() override {
    reap();
    return c10::cuda::getCurrentCUDAStream().stream();
  }

  Event record(Stream s) override {
    reap();
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    if (const auto r = cudaEventRecord(e, static_cast<cudaStream_t>(s)); r != cudaSuccess) {
      cudaEventDestroy(e);
      check(r, "cudaEventRecord");
    }
    return e;
  }

  void wait(Stream s, Event e) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0),
          "cudaStreamWaitEvent");
  }

  bool query(Event e) override {
    const auto r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaEventQuery");
    return true;
  }

  void synchronize(Event e) override {
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
  }

  void destroy(Event e) noexcept override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }

  void release_after(Event e, std::vector<at::Tensor> tensors) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.emplace_back(e, std::move(tensors));
  }

 private:
  // Drops the tensors (and events) whose events have passed.
  void reap() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (cudaEventQuery(static_cast<cudaEvent_t>(it->first)) == cudaErrorNotReady) {
        ++it;
        continue;
      }
      cudaEventDestroy(static_cast<cudaEvent_t>(it->first));
      it = pending_.erase(it);
    }
  }

  std::mutex mu_;
  std::list<std::pair<Event, std::vector<at::Tensor>>> pending_;
};

}  // namespace

std::shared_ptr<StreamOps> cuda_stream_ops() {
  // Never destroyed: at exit the CUDA runtime may be torn down before static destructors.
  static const auto* ops = new std::shared_ptr<StreamOps>(std::make_shared<CudaStreamOps>());
  return *ops;
}

}  // namespace lockstep::comm::cuda
