// lockstep/numerics/autocast.h: automatic mixed precision for a scope, as PyTorch's
// `torch.autocast`, for C++.
//
//   {
//     lockstep::numerics::Autocast ac;            // CPU, bfloat16
//     auto loss = model->forward(x).sum();   // matmuls and convolutions run in bf16
//   }                                        // the previous state is back
//   loss.backward();                         // backward runs in the dtypes of the forward
//
// The state is thread-local and nests: an inner guard may switch autocast off or pick
// another dtype, and its destructor restores exactly what the outer one set. The weight
// cast cache (a parameter cast to bf16 once per outermost scope, not once per use) is
// cleared when the outermost guard ends. libtorch decides which op runs in which dtype
// (its autocast op lists); lockstep only opens and closes the scope.
//
// CPU autocast supports bfloat16 in every libtorch; float16 on CPU needs libtorch 2.4+.
// CUDA autocast (float16 or bfloat16) needs a CUDA build of libtorch.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace lockstep::numerics {

struct AutocastOptions {
  c10::DeviceType device = c10::DeviceType::CPU;  // CPU or CUDA
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
  bool enabled = true;        // false: a scope that switches autocast off
  bool cache_enabled = true;  // cache the low-precision copies of leaf weights
};

// The autocast state of the calling thread, for both device types: what a guard saves,
// and what activation checkpointing captures in forward and re-enters in recompute.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
  bool cache_enabled = true;
};

AutocastState current_state();

// True when `device` autocast is on in this thread.
bool is_enabled(c10::DeviceType device = c10::DeviceType::CPU);

// The RAII scope. Throws InvalidArgument for a device/dtype pair this libtorch cannot
// autocast (e.g. float16 on CPU with libtorch 1.13, any CUDA autocast without CUDA).
class Autocast {
 public:
  explicit Autocast(const AutocastOptions& options = {});
  // Re-enters a captured state exactly (both devices), e.g. the forward's state for a
  // recomputation in backward.
  explicit Autocast(const AutocastState& state);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  void enter(const AutocastState& next);
  AutocastState previous_;
};

}  // namespace lockstep::numerics
