// lockstep/compat.h: the one place where libtorch version differences live.
//
// lockstep builds against Debian's libtorch 1.13 (CPU) and against CUDA libtorch
// 2.x. Everything below wraps an internal (non-"torch::" API) piece of libtorch
// that lockstep depends on, so that a change in a later libtorch is fixed here
// and nowhere else:
//   - autograd post-hooks on a parameter's AccumulateGrad node (the DDP reducer's
//     "gradient ready" signal);
//   - queueing a callback that the autograd engine runs at the end of the current
//     backward pass;
//   - resizing a tensor's storage in place (FSDP frees and re-allocates a unit's
//     gathered parameters under the views that autograd saved of them);
//   - the autocast state per device (1.13: is_cpu_enabled/set_autocast_cpu_dtype...,
//     2.4+: is_autocast_enabled(device)/set_autocast_dtype(device, dtype));
//   - the owning pointer to an autograd Node (1.13: std::shared_ptr; 2.15: c10::intrusive_ptr);
//   - the key of a parameter's state in torch::optim::Optimizer (1.13: the TensorImpl's
//     address as a string; 2.x: the address itself).
// Header-only; include it only from .cpp files or headers that need these hooks.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/version.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#define LOCKSTEP_TORCH_VERSION_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||                   \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace lockstep::compat {

// A post-hook on an autograd Node that runs `fn` after the node ran and passes
// the node's outputs through unchanged. In 1.13 and 2.x the virtual is
// operator()(outputs, inputs); 2.1+ adds an optional compiled_args() (for
// compiled autograd) whose default is fine for us: a graph with DDP hooks is
// never handed to compiled autograd by lockstep.
class LambdaPostHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit LambdaPostHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// What owns an autograd Node: std::shared_ptr in 1.13, c10::intrusive_ptr in 2.15 (whatever
// grad_accumulator() returns). Both have ->, reset() and a test for null.
using NodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// The registration of one post-hook; keeps the node alive (a parameter holds its
// AccumulateGrad node only weakly, so without this the node - and our hook -
// could be dropped and recreated between iterations).
struct PostHookHandle {
  NodePtr node;
  std::uintptr_t key = 0;
};

// Runs `fn` each time autograd has accumulated a gradient into `param.grad()`.
// `param` must be a leaf that requires grad.
inline PostHookHandle add_grad_ready_hook(const at::Tensor& param, std::function<void()> fn) {
  PostHookHandle h;
  h.node = torch::autograd::impl::grad_accumulator(param);
  h.key = h.node->add_post_hook(std::make_unique<LambdaPostHook>(std::move(fn)));
  return h;
}

// Removes a hook added by add_grad_ready_hook; safe on an empty handle.
inline void remove_hook(PostHookHandle& h) {
  if (h.node) h.node->del_post_hook(h.key);
  h.node.reset();
}

// Queues `fn` to run once, on the engine's thread, after the backward pass that
// is currently executing finished computing. Must be called from inside that
// backward (e.g. from a hook). An exception thrown by `fn` propagates out of
// backward() with its type preserved (the engine stores it in the graph task's
// future and rethrows it to the caller), in 1.13 and 2.x alike.
inline void queue_end_of_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

// The key of `param`'s entry in an optimizer's state map (torch::optim::Optimizer::state_,
// passed as `state`): 1.13 keys it by the TensorImpl's address printed into a string (what
// its c10::guts::to_string gave; 2.x has no such function), 2.x by the address itself.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const StateMap& /*state*/,
                                                const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << param.unsafeGetTensorImpl();
    return key.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Autocast state of one device type (CPU or CUDA) for the calling thread.
inline bool autocast_enabled(c10::DeviceType d) {
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(d);
#else
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType d, bool on) {
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(d, on);
#else
  if (d == c10::DeviceType::CPU)
    at::autocast::set_cpu_enabled(on);
  else
    at::autocast::set_enabled(on);
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType d) {
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(d);
#else
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) {
#if LOCKSTEP_TORCH_VERSION_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(d, t);
#else
  if (d == c10::DeviceType::CPU)
    at::autocast::set_autocast_cpu_dtype(t);
  else
    at::autocast::set_autocast_gpu_dtype(t);
#endif
}

}  // namespace lockstep::compat
