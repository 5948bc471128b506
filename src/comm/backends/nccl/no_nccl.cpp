// The NCCL backend's stand-in when lockstep is built without CUDA (LOCKSTEP_CUDA off).
#include "comm/backend_factories.h"

#include <lockstep/comm/cuda_stream_work.h>
#include <lockstep/error.h>

namespace lockstep::comm {

std::unique_ptr<Backend> make_nccl_backend(const StorePtr&, const std::string&, const LaunchEnv&,
                                           Millis) {
  throw ConfigError(
      "lockstep was built without CUDA (LOCKSTEP_CUDA off, or a CPU-only libtorch): the nccl "
      "backend is not available; rebuild against a CUDA libtorch with nvcc and NCCL installed "
      "(-DLOCKSTEP_CUDA=ON names what is missing, docs/gpu.md), or choose LOCKSTEP_BACKEND=shm "
      "or gloo");
}

bool nccl_available() { return false; }

std::shared_ptr<cuda::StreamOps> cuda::cuda_stream_ops() {
  throw ConfigError(
      "lockstep was built without CUDA (LOCKSTEP_CUDA off): CUDA streams are not available; "
      "rebuild against a CUDA libtorch (docs/gpu.md)");
}

}  // namespace lockstep::comm
