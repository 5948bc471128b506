// Activation checkpointing; see include/lockstep/numerics/activation_checkpoint.h and
// docs/memory.md.
//
// One custom autograd Function per checkpoint. Its inputs are the data inputs AND the
// block's parameters, so in the outer backward the parameters' gradients leave this node
// along ordinary edges into their AccumulateGrad nodes, once each: DDP's and FSDP's
// post-hooks on those nodes fire exactly as without checkpointing. The recomputation is
// differentiated with torch::autograd::grad, which captures the gradients of the leaves it
// is asked for without running their accumulators (a nested backward() into the
// accumulators would fire the hooks inside a nested graph task, where DDP's
// end-of-backward callback would be queued on the wrong task).
//
// Draws that lockstep::numerics::dropout makes inside the function are recorded in forward and
// handed back in the recomputation (activation_checkpoint_draws.h); they travel from forward to
// backward as saved variables after the inputs, so they are freed when backward is done with them.
#include "activation_checkpoint_draws.h"

#include <lockstep/error.h>
#include <lockstep/numerics/activation_checkpoint.h>
#include <lockstep/numerics/autocast.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/cuda.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

namespace lockstep::numerics {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// --- RNG: captured in forward, forked for the recomputation ----------------------------

struct RngState {
  at::Tensor cpu;
  std::vector<at::Tensor> cuda;  // one per device, when CUDA is available
};

at::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();  // a copy
}

void set_generator_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

at::Generator cuda_generator(int64_t device) {
  return at::globalContext().defaultGenerator(
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

RngState capture_rng() {
  RngState s;
  s.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  if (torch::cuda::is_available())
    for (int64_t d = 0; d < static_cast<int64_t>(torch::cuda::device_count()); ++d)
      s.cuda.push_back(generator_state(cuda_generator(d)));
  return s;
}

void restore_rng(const RngState& s) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), s.cpu);
  for (size_t d = 0; d < s.cuda.size(); ++d)
    set_generator_state(cuda_generator(static_cast<int64_t>(d)), s.cuda[d]);
}

// Sets the forward's RNG state for a scope and puts the caller's back afterwards (also on
// an exception): backward consumes no random numbers of the training loop's stream.
class RngFork {
 public:
  explicit RngFork(const RngState& forward_state) : previous_(capture_rng()) {
    restore_rng(forward_state);
  }
  ~RngFork() { restore_rng(previous_); }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngState previous_;
};

// --- the autograd Function ---------------------------------------------------------------

// What backward needs besides the saved inputs; held by the node (an IValue capsule).
struct State : torch::CustomClassHolder {
  ActivationCheckpointFn fn;
  size_t num_inputs = 0;
  size_t num_kept = 0;             // kept draws, saved after the inputs (value, rng state)
  bool keep_draws = true;          // ActivationCheckpointOptions::keep_dropout_masks
  std::vector<at::Tensor> params;  // those that require grad
  RngState rng;
  numerics::AutocastState autocast;
};

// Every leaf the recomputed graph reaches must be an input or a declared parameter: the
// gradient of any other leaf has no edge out of the checkpoint and would be lost.
void check_leaves_declared(const variable_list& outputs, const variable_list& inputs,
                           const std::vector<at::Tensor>& params) {
  std::unordered_set<const c10::TensorImpl*> declared;
  for (const auto& t : inputs) declared.insert(t.unsafeGetTensorImpl());
  for (const auto& t : params) declared.insert(t.unsafeGetTensorImpl());
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& o : outputs) {
    auto edge = torch::autograd::impl::gradient_edge(o);
    if (o.requires_grad() && edge.function && seen.insert(edge.function.get()).second)
      stack.push_back(edge.function.get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      const auto& v = acc->variable;
      if (v.requires_grad() && declared.count(v.unsafeGetTensorImpl()) == 0)
        throw InvalidArgument(lockstep::detail::concat(
            "lockstep::numerics::activation_checkpoint: the checkpointed function uses a tensor of "
            "shape ",
            v.sizes(), " ", v.scalar_type(),
            " that requires grad but is neither an input nor in `params`; its gradient "
            "would be lost: pass it in `params` (for a module: all of module->parameters())"));
      continue;
    }
    for (const auto& e : node->next_edges())
      if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function.get());
  }
}

// Runs fn in forward (grad mode is off there: Function::apply), recording its kept draws.
variable_list run_recording(const State& st, const variable_list& inputs, draws::KeptDraws& kept) {
  std::optional<draws::DrawFrame> frame;
  if (st.keep_draws) frame.emplace(kept, draws::DrawFrame::Mode::Record);
  return st.fn(inputs);
}

// The saved variables: the inputs, then each kept draw's value and RNG state.
variable_list saved_variables(const variable_list& inputs, const draws::KeptDraws& kept) {
  variable_list out = inputs;
  for (const auto& d : kept.draws) {
    out.push_back(d.value);
    out.push_back(d.rng_after);
  }
  return out;
}

// Runs fn again with grad on, under the forward's RNG and autocast state and with its kept
// draws, on leaves that stand in for the saved inputs.
variable_list recompute(const State& st, const variable_list& saved, variable_list& leaves) {
  for (size_t i = 0; i < st.num_inputs; ++i) {
    at::Tensor d = saved[i].detach();
    if (saved[i].requires_grad()) d.requires_grad_(true);
    leaves.push_back(d);
  }
  draws::KeptDraws kept;
  for (size_t k = 0; k < st.num_kept; ++k)
    kept.draws.push_back({saved[st.num_inputs + 2 * k], saved[st.num_inputs + 2 * k + 1]});
  RngFork fork(st.rng);
  numerics::Autocast autocast(st.autocast);
  torch::AutoGradMode grad_on(true);
  std::optional<draws::DrawFrame> frame;
  if (st.keep_draws) frame.emplace(kept, draws::DrawFrame::Mode::Replay);
  return st.fn(leaves);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // `all`: the data inputs, then the parameters; both become edges of this node.
  static variable_list forward(AutogradContext* ctx, at::TensorList all,
                               const c10::intrusive_ptr<State>& st) {
    const variable_list inputs(all.begin(), all.begin() + static_cast<int64_t>(st->num_inputs));
    st->rng = capture_rng();
    st->autocast = numerics::current_state();
    std::vector<int64_t> versions;
    for (const auto& x : inputs) versions.push_back(x._version());
    draws::KeptDraws kept;
    variable_list outputs = run_recording(*st, inputs, kept);
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i]._version() != versions[i])
        throw InvalidArgument(lockstep::detail::concat(
            "lockstep::numerics::activation_checkpoint: the checkpointed function "
            "modified its input ",
            i,
            " in place; the recomputation in backward would see the modified value: "
            "clone the input inside the function before modifying it"));
    for (size_t i = 0; i < outputs.size(); ++i)
      LOCKSTEP_CHECK(outputs[i].defined(), "lockstep::numerics::activation_checkpoint: output ", i,
                     " of the checkpointed function is undefined; return defined tensors only");
    // Version-checked again when backward unpacks them.
    ctx->save_for_backward(saved_variables(inputs, kept));
    st->num_kept = kept.draws.size();
    ctx->saved_data["state"] = at::IValue::make_capsule(st);
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (at::GradMode::is_enabled())
      throw InvalidArgument(
          "lockstep::numerics::activation_checkpoint: backward with create_graph=true (double "
          "backward) is not "
          "supported through a checkpoint; run this model without checkpointing");
    const auto st = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    variable_list leaves;
    const variable_list outputs = recompute(*st, saved, leaves);
    check_leaves_declared(outputs, leaves, st->params);

    variable_list roots, root_grads, targets;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i)
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    std::vector<size_t> slot;  // target k -> position among this node's inputs
    for (size_t i = 0; i < leaves.size(); ++i)
      if (leaves[i].requires_grad()) {
        targets.push_back(leaves[i]);
        slot.push_back(i);
      }
    for (size_t j = 0; j < st->params.size(); ++j) {
      targets.push_back(st->params[j]);
      slot.push_back(leaves.size() + j);
    }
    // One per tensor of `all`, and an undefined one for the State argument.
    variable_list result(leaves.size() + st->params.size() + 1);
    if (roots.empty() || targets.empty()) return result;
    const variable_list grads = torch::autograd::grad(roots, targets, root_grads,
                                                      /*retain_graph=*/false,
                                                      /*create_graph=*/false,
                                                      /*allow_unused=*/true);
    for (size_t k = 0; k < grads.size(); ++k) result[slot[k]] = grads[k];
    return result;
  }
};

}  // namespace

std::vector<torch::Tensor> activation_checkpoint(const ActivationCheckpointFn& fn,
                                                 const std::vector<torch::Tensor>& inputs,
                                                 const std::vector<torch::Tensor>& params,
                                                 const ActivationCheckpointOptions& options) {
  LOCKSTEP_CHECK(static_cast<bool>(fn),
                 "lockstep::numerics::activation_checkpoint: empty function");
  bool needs_grad = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    LOCKSTEP_CHECK(inputs[i].defined(), "lockstep::numerics::activation_checkpoint: input ", i,
                   " is undefined; pass defined tensors only");
    needs_grad = needs_grad || inputs[i].requires_grad();
  }
  auto st = c10::make_intrusive<State>();
  for (const auto& p : params)
    if (p.defined() && p.requires_grad()) st->params.push_back(p);
  needs_grad = needs_grad || !st->params.empty();
  if (!at::GradMode::is_enabled() || !needs_grad) return fn(inputs);  // nothing to save

  st->fn = fn;
  st->num_inputs = inputs.size();
  st->keep_draws = options.keep_dropout_masks;
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), st->params.begin(), st->params.end());
  return CheckpointFunction::apply(at::TensorList(all), st);
}

torch::Tensor activation_checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                                    const torch::Tensor& input,
                                    const std::vector<torch::Tensor>& params,
                                    const ActivationCheckpointOptions& options) {
  LOCKSTEP_CHECK(static_cast<bool>(fn),
                 "lockstep::numerics::activation_checkpoint: empty function");
  auto out = activation_checkpoint(
      [fn](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{fn(in[0])}; },
      std::vector<torch::Tensor>{input}, params, options);
  return out[0];
}

// --- the module wrapper ------------------------------------------------------------------

CheckpointedImpl::CheckpointedImpl(torch::nn::AnyModule inner, ActivationCheckpointOptions options)
    : torch::nn::Module("lockstep::numerics::Checkpointed"),
      any_(std::move(inner)),
      options_(options) {
  LOCKSTEP_CHECK(!any_.is_empty(), "lockstep::numerics::checkpoint_wrapper: empty module");
  inner_ = any_.ptr();
  // The inner module's own members under their own names: the wrapper adds no name level,
  // so checkpoints load with and without it.
  for (const auto& p : inner_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner_->named_buffers(/*recurse=*/false))
    register_buffer(b.key(), b.value());
  for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
}

torch::Tensor CheckpointedImpl::forward(const torch::Tensor& x) {
  if (!enabled_) return any_.forward(x);
  torch::nn::AnyModule layer = any_;  // shares the module; keeps it alive until backward
  return activation_checkpoint(
      [layer](const torch::Tensor& in) mutable { return layer.forward(in); }, x,
      parameters(/*recurse=*/true), options_);
}

void CheckpointedImpl::pretty_print(std::ostream& stream) const {
  stream << "lockstep::numerics::Checkpointed(";
  inner_->pretty_print(stream);
  stream << ")";
}

}  // namespace lockstep::numerics
