#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/numerics/autocast.h>

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

namespace lockstep::numerics {
namespace {

using c10::DeviceType;
using c10::ScalarType;

template <typename... Args>
void require_autocast(bool ok, const Args&... message) {
  if (!ok)
    throw InvalidArgument(lockstep::detail::concat("lockstep::numerics::Autocast: ", message...));
}

void check_supported(const AutocastOptions& o) {
  if (!o.enabled) return;
  if (o.device == DeviceType::CPU) {
    const bool ok = o.dtype == ScalarType::BFloat16 ||
                    (o.dtype == ScalarType::Half && LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 4));
    require_autocast(ok, "CPU autocast supports bfloat16",
                     LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 4) ? " and float16" : "",
                     " in this libtorch, not ", c10::toString(o.dtype));
    return;
  }
  require_autocast(o.device == DeviceType::CUDA, "autocast device must be CPU or CUDA, not ",
                   c10::DeviceTypeName(o.device));
  require_autocast(torch::cuda::is_available(),
                   "CUDA autocast needs a CUDA build of libtorch and a GPU; use the CPU "
                   "(bfloat16) instead");
  require_autocast(o.dtype == ScalarType::Half || o.dtype == ScalarType::BFloat16,
                   "CUDA autocast supports float16 and bfloat16, not ", c10::toString(o.dtype));
}

}  // namespace

AutocastState current_state() {
  AutocastState s;
  s.cpu_enabled = compat::autocast_enabled(DeviceType::CPU);
  s.cpu_dtype = compat::autocast_dtype(DeviceType::CPU);
  s.cuda_enabled = compat::autocast_enabled(DeviceType::CUDA);
  s.cuda_dtype = compat::autocast_dtype(DeviceType::CUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

bool is_enabled(DeviceType device) { return compat::autocast_enabled(device); }

Autocast::Autocast(const AutocastOptions& options) : previous_(current_state()) {
  check_supported(options);
  AutocastState next = previous_;
  if (options.device == DeviceType::CPU) {
    next.cpu_enabled = options.enabled;
    if (options.enabled) next.cpu_dtype = options.dtype;
  } else {
    next.cuda_enabled = options.enabled;
    if (options.enabled) next.cuda_dtype = options.dtype;
  }
  next.cache_enabled = options.cache_enabled;
  enter(next);
}

Autocast::Autocast(const AutocastState& state) : previous_(current_state()) { enter(state); }

void Autocast::enter(const AutocastState& next) {
  compat::set_autocast_enabled(DeviceType::CPU, next.cpu_enabled);
  compat::set_autocast_dtype(DeviceType::CPU, next.cpu_dtype);
  compat::set_autocast_enabled(DeviceType::CUDA, next.cuda_enabled);
  compat::set_autocast_dtype(DeviceType::CUDA, next.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(next.cache_enabled);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // The outermost scope drops the cached low-precision weights (they would pin memory
  // and go stale after the optimizer step).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(DeviceType::CPU, previous_.cpu_enabled);
  compat::set_autocast_dtype(DeviceType::CPU, previous_.cpu_dtype);
  compat::set_autocast_enabled(DeviceType::CUDA, previous_.cuda_enabled);
  compat::set_autocast_dtype(DeviceType::CUDA, previous_.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(previous_.cache_enabled);
}

}  // namespace lockstep::numerics
